"""A `triton-repo` repository with the in-flight ACT driver, served by a stock `tritonserver` started
directly (`tritonserver --model-repository REPO`: no PyTriton, no `hrm-deploy serve`).

The bundled sudoku-small step graph (8 ACT steps; `--halt q` spreads puzzles over 2-8 steps) on the
Python backend (`--onnx-backend python`: the bundled server has no other backend), max batch 16.
One server for the whole module; every client call has a timeout and every loop is bounded."""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.serve.helpers import StockTriton, descendants, puzzles, serving_unavailable

_WHY_NOT = serving_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")]

NAME, MAX_BATCH = "sudoku", 16


@pytest.fixture(scope="module")
def step_graph(bundled_export) -> Path:
    return bundled_export(mode="step")


@pytest.fixture(scope="module")
def reference(step_graph, trained_small, tmp_path_factory):
    """64 held-out puzzles: `solve --halt q` of the step graph (answers, steps) and the in-process
    runner with the same rule (logits and q-halt logits, to compare bit for bit)."""
    from hrm_deploy.backends import open_runner
    from hrm_deploy.serve.server import halt_function
    from hrm_deploy.solve import solve

    tokens, ids = puzzles(trained_small.data, 64)
    source = tmp_path_factory.mktemp("puzzles") / "puzzles.txt"
    source.write_text("\n".join("".join("." if t == 1 else str(t - 1) for t in row) for row in tokens) + "\n")
    solved = solve(source, step_graph, halt="q", quiet=True)
    with open_runner(step_graph) as runner:
        out = runner.infer({"inputs": tokens, "puzzle_identifiers": ids}, halt=halt_function("q", step_graph))
    assert np.array_equal(np.stack([s.answer for s in solved]), out["logits"].argmax(-1))
    assert np.array_equal(np.asarray([s.steps_used for s in solved]), out["steps_used"])
    assert len(set(out["steps_used"].tolist())) > 2  # puzzles really halt at different steps
    return tokens, ids, out


@pytest.fixture(scope="module")
def server(step_graph, tmp_path_factory):
    from hrm_deploy.serve.repo import OnnxBackend, RepoConfig, write_triton_repo

    work = tmp_path_factory.mktemp("stock_triton")
    models = write_triton_repo(
        [step_graph],
        RepoConfig(output=work / "repo", onnx_backend=OnnxBackend.python, halt="q", names=(NAME,), max_batch=MAX_BATCH),
    )
    assert [m.kind for m in models] == ["python-ort", "act-inflight"]
    triton = StockTriton(work / "repo", work)
    try:
        triton.wait_ready()
        yield triton
    finally:
        tree = descendants(triton.proc.pid)
        triton.stop()
        assert triton.proc.returncode == 0, triton.log.read_text()[-2000:]
        assert not [p for p in tree if Path(f"/proc/{p}").exists()], "stubs outlived tritonserver"


def live_puzzles(server: StockTriton) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics}/metrics", timeout=10).read().decode()
    found = re.search(rf'^hrm_act_live_puzzles{{model="{NAME}".*}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def exec_count(server: StockTriton) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics}/metrics", timeout=10).read().decode()
    return float(re.search(rf'^nv_inference_exec_count{{model="{NAME}".*}} (\S+)$', text, re.M).group(1))


def request_inputs(client_module, tokens: np.ndarray, ids: np.ndarray) -> list:
    """tritonclient's inputs (``tritonclient.http`` or ``.grpc``) for puzzles ``tokens`` [n, S], ``ids`` [n]."""
    inputs = [
        client_module.InferInput("inputs", list(tokens.shape), "INT32"),
        client_module.InferInput("puzzle_identifiers", [len(ids), 1], "INT32"),
    ]
    inputs[0].set_data_from_numpy(tokens)
    inputs[1].set_data_from_numpy(ids.reshape(-1, 1))
    return inputs


def http_one(server: StockTriton, tokens: np.ndarray, ids: np.ndarray, timeout_s: float = 60):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}", network_timeout=timeout_s)
    try:
        return client.infer(NAME, request_inputs(httpclient, tokens, ids))
    finally:
        client.close()


def grpc_one(server: StockTriton, tokens: np.ndarray, ids: np.ndarray, timeout_s: float = 60):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    try:
        return client.infer(NAME, request_inputs(grpcclient, tokens, ids), client_timeout=timeout_s)
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_answers_equal_solve_at_1_4_16_64_clients(server, reference, protocol):
    """64 puzzles, one per request, from 1, 4, 16 and 64 concurrent clients over HTTP `infer` and gRPC
    `ModelInfer`: answers and steps equal `solve --halt q`, logits and q-halt logits the in-process
    runner's bit for bit; executes are shared (in-flight), and no carry is left behind."""
    tokens, ids, ref = reference
    call = http_one if protocol == "http" else grpc_one
    for clients in (1, 4, 16, 64):
        before = exec_count(server)
        with ThreadPoolExecutor(clients) as pool:
            results = list(pool.map(lambda i: call(server, tokens[i : i + 1], ids[i : i + 1]), range(64)))
        executes = exec_count(server) - before
        for i, result in enumerate(results):
            assert np.array_equal(result.as_numpy("answer")[0], ref["logits"][i].argmax(-1)), (clients, i)
            assert int(result.as_numpy("steps")[0, 0]) == ref["steps_used"][i], (clients, i)
            assert np.array_equal(result.as_numpy("logits")[0], ref["logits"][i]), (clients, i)
            assert np.array_equal(result.as_numpy("q_halt_logits")[0], ref["q_halt_logits"][i], equal_nan=True)
        if clients >= 16:  # puzzles shared their steps: far fewer executes than puzzle-steps
            assert executes < ref["steps_used"].sum() / 2, (clients, executes)
    assert live_puzzles(server) == 0


def test_a_multi_puzzle_batch_from_our_client_is_sent_as_single_puzzles(server, reference):
    from hrm_deploy.serve.client import infer_remote

    tokens, ids, ref = reference
    out = infer_remote(
        server.url, {"inputs": tokens[:MAX_BATCH], "puzzle_identifiers": ids[:MAX_BATCH]}, model_name=NAME
    )
    assert np.array_equal(out["answer"], ref["logits"][:MAX_BATCH].argmax(-1))
    assert np.array_equal(out["steps"], ref["steps_used"][:MAX_BATCH])


def test_malformed_requests_get_errors_and_the_next_is_served(server, reference):
    from tritonclient.utils import InferenceServerException

    tokens, ids, ref = reference
    cases = {
        "out of vocabulary": (lambda: http_one(server, tokens[:1] + 11, ids[:1]), "outside the vocabulary 0..10"),
        "bad puzzle id": (lambda: http_one(server, tokens[:1], ids[:1] + 7), "puzzle identifier 7 is outside"),
        "wrong shape": (lambda: http_one(server, tokens[:1, :80], ids[:1]), "unexpected shape"),
        "two puzzles in one request": (lambda: http_one(server, tokens[:2], ids[:2]), "batch-size 1"),
        "gRPC out of vocabulary": (lambda: grpc_one(server, tokens[:1] - 5, ids[:1]), "outside the vocabulary"),
    }
    for name, (call, needle) in cases.items():
        with pytest.raises(InferenceServerException, match=needle):
            call()
        good = http_one(server, tokens[3:4], ids[3:4])
        assert np.array_equal(good.as_numpy("answer")[0], ref["logits"][3].argmax(-1)), name
    conn = http.client.HTTPConnection("127.0.0.1", server.http, timeout=30)
    try:
        conn.request(
            "POST", f"/v2/models/{NAME}/infer", body=b'{"inputs": [', headers={"Content-Type": "application/json"}
        )
        reply = conn.getresponse()
        assert reply.status >= 400 and "error" in json.loads(reply.read())  # Triton 2.51 says 500
    finally:
        conn.close()
    good = http_one(server, tokens[5:6], ids[5:6])
    assert np.array_equal(good.as_numpy("answer")[0], ref["logits"][5].argmax(-1))
    assert live_puzzles(server) == 0


def test_clients_that_leave_mid_puzzle_free_their_rows(server, reference):
    """Under load (64 puzzles queued behind 16 candidates), gRPC clients whose deadline passes
    mid-puzzle (Triton cancels them) and HTTP clients that hang up leave no carry behind: once the
    load is answered and a few more requests ran, the driver holds no puzzle."""
    tokens, ids, ref = reference
    body = json.dumps(
        {
            "inputs": [
                {"name": "inputs", "shape": [1, 81], "datatype": "INT32", "data": tokens[0].tolist()},
                {"name": "puzzle_identifiers", "shape": [1, 1], "datatype": "INT32", "data": [int(ids[0])]},
            ]
        }
    ).encode()
    with ThreadPoolExecutor(72) as pool:
        load = [pool.submit(http_one, server, tokens[i : i + 1], ids[i : i + 1]) for i in range(64)]
        gone = [pool.submit(grpc_one, server, tokens[i : i + 1], ids[i : i + 1], 0.02) for i in range(8)]
        for _ in range(8):  # HTTP clients that send a request and hang up at once
            with socket.create_connection(("127.0.0.1", server.http), timeout=10) as sock:
                sock.sendall(f"POST /v2/models/{NAME}/infer HTTP/1.1\r\nHost: x\r\n".encode())
                sock.sendall(f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        for i, future in enumerate(load):
            assert np.array_equal(future.result(timeout=300).as_numpy("answer")[0], ref["logits"][i].argmax(-1))
        for future in gone:
            with pytest.raises(Exception, match="Deadline|DEADLINE|cancel"):
                future.result(timeout=60)
    time.sleep(1.5)  # a carry unseen this long (and for a few executes) belongs to a dropped request
    for i in range(3):
        http_one(server, tokens[i : i + 1], ids[i : i + 1])
    assert live_puzzles(server) == 0


def _rss_kib(pids: set[int]) -> int:
    total = 0
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.M)
        total += int(found.group(1)) if found else 0
    return total


def test_memory_is_flat_over_1000_requests(server, reference):
    """The server and its stubs (the driver holds a carry per live puzzle) use no more memory after
    1,008 more requests from 16 clients than after the first 208: a carry kept per answered request
    (41 KiB for this model) would add 40 MiB, 2.5 x the bound."""
    tokens, ids, _ = reference

    def client(n: int) -> int:  # one kept-alive connection per client, n single-puzzle requests
        import tritonclient.http as httpclient

        connection = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}", network_timeout=60)
        try:
            for i in range(n):
                inputs = request_inputs(httpclient, tokens[i % 64 : i % 64 + 1], ids[i % 64 : i % 64 + 1])
                assert connection.infer(NAME, inputs).as_numpy("answer").shape == (1, 81)
        finally:
            connection.close()
        return n

    def run(n: int) -> None:
        with ThreadPoolExecutor(16) as pool:
            assert sum(pool.map(client, [n // 16] * 16)) == n // 16 * 16

    tree = descendants(server.proc.pid) | {server.proc.pid}
    run(208)  # 13 requests from each of 16 clients
    before = _rss_kib(tree)
    run(1008)  # 63 requests from each client
    after = _rss_kib(tree)
    assert live_puzzles(server) == 0
    assert after - before < 16 * 1024, f"RSS grew by {(after - before) / 1024:.1f} MiB over 1,008 requests"
