"""`hrm-deploy serve` against a real tritonserver (PyTriton's bundled one) on 127.0.0.1.

Needs the serve extra in a venv made from the system Python (see README, Serving); CI makes
that venv. Every request loop is bounded and every client call has a timeout."""

from __future__ import annotations

import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hrm_deploy.errors import ConfigError
from hrm_deploy.serve.server import ServeConfig, check_bind, halt_function, is_loopback
from tests.serve.helpers import (
    ServeProcess,
    alive,
    describe,
    puzzles,
    repository_server,
    serving_unavailable,
)

_WHY_NOT = serving_unavailable()
live = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")


@pytest.fixture(scope="module")
def reference(tiny_onnx):
    """The in-process runner's answers on 48 held-out puzzles (what the server must reproduce)."""
    from hrm_deploy.backends import open_runner

    tokens, ids = puzzles(tiny_onnx.data, 48)
    runner = open_runner(tiny_onnx.unrolled)
    runner.activate()
    out = runner.infer({"inputs": tokens, "puzzle_identifiers": ids})
    runner.close()
    return tokens, ids, out


@pytest.fixture(scope="module")
def server(tiny_onnx, tmp_path_factory):
    proc = ServeProcess(Path(tiny_onnx.unrolled), tmp_path_factory.mktemp("serve") / "serve.log", "--max-batch", "16")
    try:
        proc.wait_ready()
        yield proc
    finally:
        if proc.proc.poll() is None:
            code = proc.stop()
            assert code == 0, proc.log.read_text()[-2000:]
        assert not proc.leftovers(), f"processes left after stop: {proc.leftovers()}"


def test_bind_rules():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    with pytest.raises(ConfigError, match="--allow-remote"):
        check_bind(ServeConfig(Path("x.onnx"), host="0.0.0.0"))
    check_bind(ServeConfig(Path("x.onnx"), host="0.0.0.0", allow_remote=True))
    with pytest.raises(ConfigError, match="different ports"):
        check_bind(ServeConfig(Path("x.onnx"), http_port=9000, grpc_port=9000))
    assert halt_function("off") is None


def test_halt_rule_is_loaded_only_when_asked(monkeypatch):
    import sys

    from hrm_deploy.errors import HRMDeployError

    monkeypatch.delitem(sys.modules, "hrm_deploy.halting", raising=False)
    assert halt_function("off") is None and "hrm_deploy.halting" not in sys.modules
    try:
        fn = halt_function("q")
    except HRMDeployError as exc:  # this build has no early halting yet: one clear line
        assert "--halt off" in str(exc)
    else:
        assert callable(fn)


def test_non_loopback_refused_by_cli(tiny_onnx):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    result = CliRunner().invoke(app, ["serve", str(tiny_onnx.unrolled), "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "--allow-remote" in result.output


@pytest.mark.slow
@live
def test_concurrent_clients_get_the_runners_answers(server, reference):
    from hrm_deploy.serve.client import infer_remote

    tokens, ids, ref = reference
    clients, per_client = 6, 8  # 48 single-puzzle requests from 6 threads at once

    def client(c: int) -> list[tuple[int, dict]]:
        got = []
        for j in range(per_client):
            i = c * per_client + j
            got.append(
                (
                    i,
                    infer_remote(
                        server.url, {"inputs": tokens[i : i + 1], "puzzle_identifiers": ids[i : i + 1]}, timeout_s=60
                    ),
                )
            )
        return got

    with ThreadPoolExecutor(clients) as pool:
        results = [r for f in [pool.submit(client, c) for c in range(clients)] for r in f.result(timeout=300)]
    assert sorted(i for i, _ in results) == list(range(clients * per_client))  # nothing lost, nothing doubled
    answers = np.concatenate([o["answer"] for _, o in sorted(results, key=lambda r: r[0])])
    assert np.array_equal(answers, ref["logits"].argmax(-1))
    logits = np.concatenate([o["logits"] for _, o in sorted(results, key=lambda r: r[0])])
    assert np.abs(logits - ref["logits"]).max() < 1e-4  # other batch compositions: float noise only
    steps = np.concatenate([o["steps"] for _, o in results])
    assert (steps == ref["q_halt_logits"].shape[1]).all()
    # Triton's dynamic batcher really batched: fewer model executions than requests (Prometheus metrics)
    import re
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics}/metrics", timeout=10).read().decode()
    count = {
        k: float(re.search(rf'^{k}{{model="hrm".*}} (\S+)$', text, re.MULTILINE).group(1))
        for k in ("nv_inference_request_success", "nv_inference_exec_count")
    }
    assert count["nv_inference_request_success"] >= clients * per_client
    assert count["nv_inference_exec_count"] < count["nv_inference_request_success"], count
    # a multi-puzzle request keeps its order
    out = infer_remote(server.url, {"inputs": tokens[:5], "puzzle_identifiers": ids[:5]})
    assert np.array_equal(out["answer"], ref["logits"][:5].argmax(-1))


@pytest.mark.slow
@live
def test_bad_requests_get_errors_and_serving_goes_on(server, reference):
    import tritonclient.http as httpclient

    from hrm_deploy.serve.client import RemoteError, infer_remote

    tokens, ids, ref = reference
    good = {"inputs": tokens[:2], "puzzle_identifiers": ids[:2]}

    def raw(shape_in, dtype, n_ids):
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}", network_timeout=30)
        x = np.zeros(shape_in, dtype)
        i = [
            httpclient.InferInput("inputs", list(x.shape), "INT64" if dtype == np.int64 else "INT32"),
            httpclient.InferInput("puzzle_identifiers", [n_ids, 1], "INT32"),
        ]
        i[0].set_data_from_numpy(x)
        i[1].set_data_from_numpy(np.zeros((n_ids, 1), np.int32))
        return client.infer("hrm", i)

    cases = {
        "out of vocabulary": (
            lambda: infer_remote(server.url, {"inputs": tokens[:2] + 11, "puzzle_identifiers": ids[:2]}),
            "outside the vocabulary 0..10",
        ),
        "puzzle id": (
            lambda: infer_remote(server.url, {"inputs": tokens[:2], "puzzle_identifiers": ids[:2] + 3}),
            "puzzle identifier 3 is outside",
        ),
        "wrong shape": (
            lambda: infer_remote(server.url, {"inputs": tokens[:2, :80], "puzzle_identifiers": ids[:2]}),
            r"input 'inputs' has shape \[2, 80\]",
        ),
        "oversized batch": (
            lambda: infer_remote(
                server.url, {"inputs": np.repeat(tokens[:1], 17, 0), "puzzle_identifiers": np.repeat(ids[:1], 17)}
            ),
            r"1 <= B <= 16",
        ),
    }
    for name, (call, message) in cases.items():
        with pytest.raises(RemoteError, match=message):
            call()
        assert np.array_equal(infer_remote(server.url, good)["answer"], ref["logits"][:2].argmax(-1)), name
    for name, call in {
        "wrong dtype": lambda: raw((1, 81), np.int64, 1),
        "empty batch": lambda: raw((0, 81), np.int32, 0),
    }.items():
        with pytest.raises(Exception, match="datatype 'INT64'|1 <= B <= 16"):
            call()
        assert np.array_equal(infer_remote(server.url, good)["answer"], ref["logits"][:2].argmax(-1)), name


@pytest.mark.slow
@live
def test_stop_mid_load_then_restart(tiny_onnx, reference, tmp_path):
    """SIGTERM while 4 clients hammer the server: every call ends (answer or error) well within its
    timeout, the server exits 0 and leaves no process; SIGKILL of tritonserver itself makes `serve`
    exit non-zero, also without leftovers; a new server then answers again, and SIGKILL of `serve`
    leaves no process either."""
    from hrm_deploy.serve.client import RemoteError, infer_remote

    tokens, ids, ref = reference
    proc = ServeProcess(Path(tiny_onnx.unrolled), tmp_path / "a.log")
    proc.wait_ready()
    outcomes: list[str] = []
    stop_clients = threading.Event()

    def client(c: int) -> None:
        for j in range(2000):  # bounded, and more than the clients can finish before the SIGTERM
            if stop_clients.is_set():
                return
            i = (c * 7 + j) % len(tokens)
            t0 = time.monotonic()
            try:
                out = infer_remote(
                    proc.url, {"inputs": tokens[i : i + 1], "puzzle_identifiers": ids[i : i + 1]}, timeout_s=20
                )
                assert np.array_equal(out["answer"][0], ref["logits"][i].argmax(-1))
                outcomes.append("ok")
            except RemoteError:
                outcomes.append("error")
            assert time.monotonic() - t0 < 25, "a client call outlived its timeout"
            if outcomes.count("error") > 3 * 4:
                return

    threads = [threading.Thread(target=client, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while outcomes.count("ok") < 8 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.stop(signal.SIGTERM) == 0
    for t in threads:
        t.join(timeout=60)
    stop_clients.set()
    assert not any(t.is_alive() for t in threads), "a client hung after the server stopped"
    assert outcomes.count("ok") >= 8 and "error" in outcomes
    assert not proc.leftovers(), "tritonserver or its stubs outlived `serve`"

    # tritonserver dies under `serve` (OOM killer, crash): serve notices and exits non-zero, nothing left
    proc2 = ServeProcess(Path(tiny_onnx.unrolled), tmp_path / "b.log")
    proc2.wait_ready()
    triton = [
        p for p in proc2.tree if Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0].endswith(b"bin/tritonserver")
    ]
    assert triton, "no tritonserver child found"
    import os

    os.kill(triton[0], signal.SIGKILL)
    try:
        assert proc2.proc.wait(timeout=60) != 0
    finally:
        if proc2.proc.poll() is None:
            proc2.kill()
    assert not proc2.leftovers(), "processes left after tritonserver was killed"

    with pytest.raises(RemoteError):
        infer_remote(proc.url, {"inputs": tokens[:1], "puzzle_identifiers": ids[:1]}, timeout_s=5)
    proc3 = ServeProcess(Path(tiny_onnx.unrolled), tmp_path / "c.log")
    try:
        proc3.wait_ready()
        out = infer_remote(proc3.url, {"inputs": tokens[:3], "puzzle_identifiers": ids[:3]})
        assert np.array_equal(out["answer"], ref["logits"][:3].argmax(-1))
        # `serve` itself SIGKILLed (no handler runs): tritonserver follows (PyTriton starts it with
        # PR_SET_PDEATHSIG) and takes its stubs along; only PyTriton's workspace copy stays on disk.
        workspace = {
            Path(a.decode()).parent
            for p in proc3.tree
            if alive(p)
            for a in Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            if a.endswith(b"/model-store")
        }
    finally:
        proc3.stop(signal.SIGKILL)
    # Orphans notice on their own (PDEATHSIG's SIGTERM, then Triton's 5 s exit timeout; stubs and
    # PyTriton's helpers poll their parent): on a loaded 2-core CI machine that took over 20 s once.
    left = proc3.leftovers(timeout_s=60)
    assert not left, f"outlived a SIGKILLed `serve` by 60 s: {describe(left)}"
    for folder in workspace:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def repository(tiny_onnx, tmp_path_factory):
    """One generated repository in PyTriton's tritonserver for the tests that only query it: the
    trained fixture's unrolled graph and its step graph behind the ACT driver (``unrolled``, ``act``),
    and a 4-step random-weight step graph behind the driver with halting off and at a threshold that
    stops about half the rows after step 1 (``off``, ``thr``). That server has only the Python
    backend, so the ONNX graphs run with --onnx-backend python (ONNX Runtime inside the stub); the
    onnxruntime / tensorrt_plan configs are checked structurally (test_repo.py). Yields the URL and
    the random graph's host-loop outputs with the threshold's logit."""
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.onnx_runtime import ort_session, run_stepwise
    from hrm_deploy.serve.repo import OnnxBackend, RepoConfig, write_triton_repo
    from tests.conftest import make_tiny_model

    work = tmp_path_factory.mktemp("repository")
    ckpt = save_checkpoint(work / "random.pt", make_tiny_model())
    step = export_onnx(str(ckpt), work / "random.step.onnx", ExportConfig(mode="step", parity=False), quiet=True).path
    rng = np.random.default_rng(0)
    tokens, ids = rng.integers(1, 11, (12, 81)).astype(np.int32), np.zeros(12, np.int32)
    ref = run_stepwise(ort_session(step), {"inputs": tokens, "puzzle_identifiers": ids}, None, 4)
    q = np.sort(ref["q_halt_logits"][:, 0])
    cut = (q[5] + q[6]) / 2  # about half the rows halt after step 1
    threshold = f"threshold:{float(1 / (1 + np.exp(-cut))):.12f}"
    repo = work / "repo"
    repo.mkdir()
    parts = [  # (graphs, model names, halting rule, max batch)
        ([tiny_onnx.unrolled, tiny_onnx.step], ("unrolled", "act"), None, 8),
        ([step], ("off",), None, None),
        ([step], ("thr",), threshold, None),
    ]
    for i, (graphs, names, halt, max_batch) in enumerate(parts):  # one repository of every part's models
        out = work / f"part{i}"
        config = RepoConfig(output=out, onnx_backend=OnnxBackend.python, names=names, halt=halt, max_batch=max_batch)
        write_triton_repo(graphs, config)
        for folder in out.iterdir():
            folder.rename(repo / folder.name)
    with repository_server(repo) as url:
        yield SimpleNamespace(url=url, tokens=tokens, ids=ids, ref=ref, cut=cut)


@pytest.mark.slow
@live
def test_generated_repository_answers_in_bundled_tritonserver(repository, reference):
    """The repository for the unrolled graph and for the step graph (ACT driver + BLS) loads in
    PyTriton's tritonserver and answers as the in-process runner."""
    from hrm_deploy.serve.client import infer_remote

    tokens, ids, ref = reference
    for name in ("unrolled", "act"):
        out = infer_remote(repository.url, {"inputs": tokens[:8], "puzzle_identifiers": ids[:8]}, model_name=name)
        assert np.array_equal(out["answer"], ref["logits"][:8].argmax(-1)), name
        assert np.abs(out["logits"] - ref["logits"][:8]).max() < 1e-4, name
        assert out["q_halt_logits"].shape == (8, 1) and (out["steps"] == 1).all()


@pytest.mark.slow
@live
def test_act_driver_halting_in_bundled_tritonserver(repository):
    """A 4-step random-weight step graph behind the generated ACT driver (BLS loop in Triton):
    halt off gives the host loop's outputs; threshold:X stops each row at its first step with
    sigmoid(q_halt) > X, with that step's answer, while other rows go on in a smaller batch."""
    from hrm_deploy.serve.client import infer_remote

    tokens, ids, ref = repository.tokens, repository.ids, repository.ref
    fires = ref["q_halt_logits"] > repository.cut
    want_steps = np.where(fires.any(1), fires.argmax(1) + 1, 4)
    assert 1 <= (want_steps == 1).sum() < 12
    off = infer_remote(repository.url, {"inputs": tokens, "puzzle_identifiers": ids}, model_name="off")
    assert np.array_equal(off["answer"], ref["logits"].argmax(-1)) and (off["steps"] == 4).all()
    assert np.abs(off["q_halt_logits"] - ref["q_halt_logits"]).max() < 1e-4
    thr = infer_remote(repository.url, {"inputs": tokens, "puzzle_identifiers": ids}, model_name="thr")
    assert np.array_equal(thr["steps"], want_steps)
    rows = np.arange(12)
    assert np.array_equal(thr["answer"], ref["step_predictions"][rows, want_steps - 1])


@pytest.mark.slow
def test_solve_url_answers_like_the_in_process_runner(server, reference, tmp_path):
    """`hrm-deploy solve --url` end to end: the library call the command makes, against the real server."""
    from hrm_deploy.solve import solve

    tokens, _, ref = reference
    digits = ["".join("." if t == 1 else str(t - 1) for t in row) for row in tokens[:4]]
    source = tmp_path / "puzzles.txt"
    source.write_text("\n".join(digits) + "\n")
    solutions = solve(source, url=server.url)
    assert len(solutions) == 4
    for i, solution in enumerate(solutions):
        np.testing.assert_array_equal(solution.answer, ref["logits"][i].argmax(-1))
        assert solution.steps_used == ref["steps_used"][i]


def _post(server, body: bytes, headers: dict[str, str] | None = None, path: str = "/v2/models/hrm/infer"):
    """One raw HTTP POST to the server; (status, parsed JSON body or text)."""
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", server.http, timeout=30)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        reply = conn.getresponse()
        text = reply.read().decode(errors="replace")
    finally:
        conn.close()
    try:
        return reply.status, json.loads(text)
    except ValueError:
        return reply.status, text


@pytest.mark.slow
@live
def test_hostile_requests_are_refused_and_the_server_lives(server, reference):
    """Each request below used to abort tritonserver (a huge declared shape: std::bad_alloc), get
    HTTP 500, or take gigabytes. Now each is one 4xx line, and a good request is answered after it."""
    import json

    from hrm_deploy.serve.client import infer_remote

    tokens, ids, ref = reference

    def infer_json(shape, data, dtype="INT32", ids_shape=(1, 1)):
        return json.dumps(
            {
                "inputs": [
                    {"name": "inputs", "shape": shape, "datatype": dtype, "data": data},
                    {"name": "puzzle_identifiers", "shape": list(ids_shape), "datatype": "INT32", "data": [0]},
                ]
            }
        ).encode()

    row = [1] * 81
    cases = {
        "huge shape": (infer_json([10**12, 81], row), 400, "1 <= B <= 16"),
        "negative shape": (infer_json([-1, 81], row), 400, "1 <= B <= 16"),
        "data not matching its shape": (infer_json([1, 81], row[:40]), 400, "holds 40 values; its shape needs 81"),
        "malformed JSON": (b'{"inputs": [', 400, "not valid JSON"),
        "wrong type": (infer_json([1, 81], row, dtype="FP32"), 400, "datatype 'FP32'"),
        "strings as data": (infer_json([1, 81], ["x"] * 81), 400, "its shape needs 81"),
        "no inputs": (b"{}", 400, "no 'inputs' list"),
        "binary size lie": (
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": "inputs",
                            "shape": [1, 81],
                            "datatype": "INT32",
                            "parameters": {"binary_data_size": 324},
                        },
                        {"name": "puzzle_identifiers", "shape": [1, 1], "datatype": "INT32", "data": [0]},
                    ]
                }
            ).encode(),
            400,
            "binary data of 0 bytes",
        ),
    }
    for name, (body, status, needle) in cases.items():
        got, payload = _post(server, body)
        assert got == status and needle in str(payload), (name, got, payload)
        assert np.array_equal(
            infer_remote(server.url, {"inputs": tokens[:2], "puzzle_identifiers": ids[:2]})["answer"],
            ref["logits"][:2].argmax(-1),
        ), name
    # a large body is refused from its Content-Length, before it is read
    import socket

    with socket.create_connection(("127.0.0.1", server.http), timeout=30) as sock:
        sock.sendall(b"POST /v2/models/hrm/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 500000000\r\n\r\n{")
        head = sock.recv(4096).decode(errors="replace")
    assert " 413 " in head.splitlines()[0] and "exceeds this server's limit" in head, head
    assert server.proc.poll() is None
