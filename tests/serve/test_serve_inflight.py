"""`hrm-deploy serve STEP_GRAPH --halt q` (in-flight batching) against a real tritonserver on 127.0.0.1.

The bundled sudoku-small step graph (8 ACT steps; halting on q spreads puzzles over 2-8 steps).
Every request loop is bounded and every client call has a timeout."""

from __future__ import annotations

import http.client
import json
import re
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from hrm_deploy.backends.torch.builder.options import TorchOptions
from tests.serve.helpers import ServeProcess, puzzles, serving_unavailable

_WHY_NOT = serving_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")]


@pytest.fixture(scope="module")
def small_step(bundled_export):
    return bundled_export(mode="step")


@pytest.fixture(scope="module")
def reference(small_step, trained_small):
    """The in-process runner's outputs (halting on q) on 64 held-out puzzles."""
    from hrm_deploy.backends import open_runner
    from hrm_deploy.halting import HaltRule

    tokens, ids = puzzles(trained_small.data, 64)
    with open_runner(small_step) as runner:
        out = runner.infer({"inputs": tokens, "puzzle_identifiers": ids}, halt=HaltRule.parse("q").should_halt)
    assert len(set(out["steps_used"].tolist())) > 2
    return tokens, ids, out


def _started(artifact: Path, log: Path, *extra: str) -> ServeProcess:
    proc = ServeProcess(artifact, log, "--halt", "q", *extra)
    proc.wait_ready()
    assert "in-flight batching" in log.read_text(), log.read_text()[-2000:]
    return proc


def _stop_clean(proc: ServeProcess) -> None:
    if proc.proc.poll() is None:
        assert proc.stop() == 0, proc.log.read_text()[-2000:]
    assert not proc.leftovers(), "processes left after stop"


@pytest.fixture(scope="module")
def server(small_step, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    proc = _started(small_step, log, "--max-batch", "8", "--queue-limit", "1024")
    try:
        yield proc
    finally:
        _stop_clean(proc)


def gauges(proc: ServeProcess) -> dict[str, float]:
    text = urllib.request.urlopen(f"{proc.url}/metrics", timeout=10).read().decode()
    return {
        m.group(1): float(m.group(2)) for m in re.finditer(r'^hrm_inflight_(\w+)\{model="hrm"\} (\S+)$', text, re.M)
    }


def _post(
    proc: ServeProcess, body: bytes, timeout_s: float = 60, headers: dict[str, str] | None = None
) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", proc.http, timeout=timeout_s)
    try:
        conn.request("POST", "/v2/models/hrm/infer", body=body, headers=headers or {"Content-Type": "application/json"})
        reply = conn.getresponse()
        text = reply.read().decode(errors="replace")
        return reply.status, dict(reply.getheaders()), json.loads(text)
    finally:
        conn.close()


def _json_request(tokens: np.ndarray, ids: np.ndarray, data: list[int] | None = None) -> bytes:
    """Triton's JSON form of one request (``data`` replaces the tokens' values, e.g. out of range)."""
    values = tokens.ravel().tolist() if data is None else data
    return json.dumps(
        {
            "inputs": [
                {"name": "inputs", "shape": list(tokens.shape), "datatype": "INT32", "data": values},
                {"name": "puzzle_identifiers", "shape": [len(ids), 1], "datatype": "INT32", "data": ids.tolist()},
            ],
            "outputs": [{"name": "answer"}, {"name": "steps"}],
        }
    ).encode()


def test_answers_equal_the_runner_under_concurrent_load(server, reference):
    """1, 4 and 16 closed-loop clients, single- and multi-puzzle requests: every answer, step count
    and q-halt logit equals the in-process runner's; the loop shared its steps between requests."""
    from hrm_deploy.serve.client import infer_remote

    tokens, ids, ref = reference
    before = gauges(server)
    for clients in (1, 4, 16):
        requests = [(a, min(a + 1 + a % 3, 64)) for a in range(0, 64, 2)]

        def client(mine):
            got = []
            for a, b in mine:
                got.append(
                    (
                        a,
                        b,
                        infer_remote(server.url, {"inputs": tokens[a:b], "puzzle_identifiers": ids[a:b]}, timeout_s=60),
                    )
                )
            return got

        with ThreadPoolExecutor(clients) as pool:
            futures = [pool.submit(client, requests[c::clients]) for c in range(clients)]
            results = [r for f in futures for r in f.result(timeout=300)]
        assert len(results) == len(requests)
        for a, b, out in results:
            assert np.array_equal(out["answer"], ref["logits"][a:b].argmax(-1)), (clients, a)
            assert np.array_equal(out["steps"], ref["steps_used"][a:b]), (clients, a)
            assert np.array_equal(out["q_halt_logits"], ref["q_halt_logits"][a:b], equal_nan=True), (clients, a)
            assert np.abs(out["logits"] - ref["logits"][a:b]).max() < 1e-5
            assert (out["act_steps"] == 8).all()
    after = gauges(server)
    answered = after["puzzles_answered_total"] - before["puzzles_answered_total"]
    steps = after["step_calls_total"] - before["step_calls_total"]
    assert answered >= 3 * sum(b - a for a, b in requests)
    assert steps < answered * ref["steps_used"].mean(), "puzzles never shared a step: nothing was batched"
    assert after["steps_per_answer"] > 1 and after["slots"] == 8


def test_a_bad_request_fails_alone(server, reference):
    """Bad requests sent while good ones are in the loop get HTTP 400 each; every good request
    around them is answered correctly (in-flight requests are never batched with a bad one)."""
    tokens, ids, ref = reference
    bad = {
        "out of vocabulary": (_json_request(tokens[:2] + 11, ids[:2]), "outside the vocabulary 0..10"),
        "puzzle id": (_json_request(tokens[:2], ids[:2] + 5), "puzzle identifier 5 is outside"),
        "values beyond int32": (
            _json_request(tokens[:1], ids[:1], [99999999999] + [1] * 80),
            "token 99999999999 at position 0 is outside",
        ),
    }
    stop = threading.Event()
    good: list[bool] = []

    def good_client(c: int) -> None:
        for j in range(60):  # bounded
            if stop.is_set():
                return
            a = (c * 5 + j) % 60
            status, _, body = _post(server, _json_request(tokens[a : a + 3], ids[a : a + 3]))
            answer = np.asarray(body["outputs"][0]["data"]).reshape(3, -1) if status == 200 else None
            good.append(status == 200 and np.array_equal(answer, ref["logits"][a : a + 3].argmax(-1)))

    threads = [threading.Thread(target=good_client, args=(c,)) for c in range(4)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while len(good) < 4 and time.monotonic() < deadline:  # good requests are flowing
            time.sleep(0.01)
        for _ in range(3):
            for name, (body, needle) in bad.items():
                status, _, payload = _post(server, body)
                assert status == 400 and needle in payload["error"], (name, status, payload)
            # a binary size given as a float: 400, not a dropped connection
            request = json.loads(_json_request(tokens[:1], ids[:1]))
            request["inputs"][0].pop("data")
            request["inputs"][0]["parameters"] = {"binary_data_size": float(tokens[:1].nbytes)}
            head = json.dumps(request).encode()
            length = {"Inference-Header-Content-Length": str(len(head))}
            status, _, payload = _post(server, head + tokens[:1].astype("<i4").tobytes(), headers=length)
            assert status == 400 and "bytes of binary data" in payload["error"], (status, payload)
        settled = len(good) + 4
        while len(good) < settled and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert good and all(good), f"{good.count(False)} of {len(good)} good requests failed next to bad ones"


def test_client_disconnect_and_timeout_leave_the_loop(server, reference):
    """A client that hangs up while its request waits, and a request whose own timeout runs out,
    are dropped (counted in the gauges); the server answers the next request."""
    import socket

    import tritonclient.http as httpclient

    from hrm_deploy.serve.client import infer_remote

    tokens, ids, ref = reference
    before = gauges(server)
    with ThreadPoolExecutor(64) as pool:  # 512 puzzles ahead in the queue: hundreds of steps
        load = [
            pool.submit(
                infer_remote,
                server.url,
                {"inputs": tokens[a : a + 8], "puzzle_identifiers": ids[a : a + 8]},
                timeout_s=300,
            )
            for a in [8 * (k % 7) for k in range(64)]
        ]
        deadline = time.monotonic() + 10  # wait until most of them are queued (>= 96 step calls ahead)
        while gauges(server)["queue_puzzles"] < 128 and time.monotonic() < deadline:
            time.sleep(0.01)
        body = _json_request(tokens[:8], ids[:8])
        sock = socket.create_connection(("127.0.0.1", server.http), timeout=10)
        sock.sendall(b"POST /v2/models/hrm/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        time.sleep(0.3)  # its request is taken and waits behind the load (one that closes at once is never read)
        sock.close()  # gone before its answer
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}", network_timeout=30)
        inputs = [
            httpclient.InferInput("inputs", [8, 81], "INT32"),
            httpclient.InferInput("puzzle_identifiers", [8, 1], "INT32"),
        ]
        inputs[0].set_data_from_numpy(tokens[:8])
        inputs[1].set_data_from_numpy(ids[:8].reshape(-1, 1))
        with pytest.raises(Exception, match="timed out"):
            client.infer("hrm", inputs, timeout=1)  # 1 microsecond: the loop drops it at the next step
        client.close()
        for f in load:
            assert f.result(timeout=300)["answer"].shape == (8, 81)
    deadline = time.monotonic() + 10
    while gauges(server)["clients_gone_total"] == before["clients_gone_total"] and time.monotonic() < deadline:
        time.sleep(0.1)
    after = gauges(server)
    assert after["clients_gone_total"] > before["clients_gone_total"]
    assert after["timed_out_total"] > before["timed_out_total"]
    out = infer_remote(server.url, {"inputs": tokens[:2], "puzzle_identifiers": ids[:2]})
    assert np.array_equal(out["answer"], ref["logits"][:2].argmax(-1))


def test_queue_limit_answers_503_with_retry_after(small_step, reference, tmp_path):
    tokens, ids, ref = reference
    proc = _started(small_step, tmp_path / "q.log", "--max-batch", "2", "--queue-limit", "2")
    try:
        body = _json_request(tokens[:2], ids[:2])
        with ThreadPoolExecutor(12) as pool:
            replies = list(pool.map(lambda _: _post(proc, body), range(36)))
        statuses = [s for s, _, _ in replies]
        assert 503 in statuses and 200 in statuses, statuses
        for status, headers, payload in replies:
            if status == 503:
                assert int(headers["Retry-After"]) >= 1 and "limit 2" in payload["error"]
            else:
                assert status == 200
                assert np.array_equal(np.reshape(payload["outputs"][0]["data"], (2, -1)), ref["logits"][:2].argmax(-1))
        assert gauges(proc)["refused_queue_full_total"] == statuses.count(503)
    finally:
        _stop_clean(proc)


def test_sigterm_under_load_is_clean(small_step, reference, tmp_path):
    """SIGTERM while 6 clients keep the loop busy: each call ends in its answer (correct) or an
    error well within its timeout, `serve` exits 0 and leaves no process."""
    from hrm_deploy.errors import RemoteError
    from hrm_deploy.serve.client import infer_remote

    tokens, ids, ref = reference
    proc = _started(small_step, tmp_path / "t.log", "--max-batch", "4")
    outcomes: list[str] = []

    def client(c: int) -> None:
        for j in range(300):  # bounded
            a = (c * 7 + j) % 60
            t0 = time.monotonic()
            try:
                out = infer_remote(
                    proc.url, {"inputs": tokens[a : a + 4], "puzzle_identifiers": ids[a : a + 4]}, timeout_s=20
                )
                outcomes.append("ok" if np.array_equal(out["answer"], ref["logits"][a : a + 4].argmax(-1)) else "wrong")
            except RemoteError:
                outcomes.append("error")
            assert time.monotonic() - t0 < 25, "a client call outlived its timeout"
            if outcomes.count("error") > 12:
                return

    threads = [threading.Thread(target=client, args=(c,)) for c in range(6)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while outcomes.count("ok") < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.stop(signal.SIGTERM) == 0, proc.log.read_text()[-2000:]
        for t in threads:
            t.join(timeout=90)
        assert not any(t.is_alive() for t in threads), "a client hung after the server stopped"
        assert "wrong" not in outcomes and outcomes.count("ok") >= 12 and "error" in outcomes
        assert not proc.leftovers(), "tritonserver or its stubs outlived `serve`"
    finally:
        if proc.proc.poll() is None:
            proc.kill()


def test_grpc_requests_go_through_the_same_loop(server, reference):
    """gRPC reaches tritonserver (not the front); its bound function feeds the same ACT loop."""
    import tritonclient.grpc as grpcclient

    tokens, ids, ref = reference
    before = gauges(server)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
    try:
        inputs = [
            grpcclient.InferInput("inputs", [5, 81], "INT32"),
            grpcclient.InferInput("puzzle_identifiers", [5, 1], "INT32"),
        ]
        inputs[0].set_data_from_numpy(tokens[10:15])
        inputs[1].set_data_from_numpy(ids[10:15].reshape(-1, 1))
        result = client.infer("hrm", inputs, client_timeout=60)
    finally:
        client.close()
    assert np.array_equal(result.as_numpy("answer"), ref["logits"][10:15].argmax(-1))
    assert np.array_equal(result.as_numpy("steps").reshape(-1), ref["steps_used"][10:15])
    assert gauges(server)["puzzles_answered_total"] - before["puzzles_answered_total"] == 5


@pytest.fixture(scope="module")
def small_engine(trained_small, tmp_path_factory):
    """The bundled model's PyTorch step engine for this CPU (AOTInductor)."""
    from hrm_deploy.engines.build import EngineConfig, build_engine

    folder = tmp_path_factory.mktemp("inflight_engine")
    config = EngineConfig(precision="fp32", backend="torch", max_batch=16, options=TorchOptions(device="cpu"))
    return build_engine(trained_small.checkpoint, config, folder / "small.step.pt2", quiet=True).path


def test_a_step_engine_is_served_in_flight_like_the_runner(small_engine, reference, tmp_path):
    """A `.pt2` step engine runs the loop one step per call (the device loop's per-row entry):
    under 8 clients each request's answers and steps equal the engine's own runner on it."""
    from hrm_deploy.backends import open_runner
    from hrm_deploy.halting import HaltRule
    from hrm_deploy.serve.client import infer_remote

    tokens, ids, _ = reference
    with open_runner(small_engine) as runner:
        ref = runner.infer({"inputs": tokens, "puzzle_identifiers": ids}, halt=HaltRule.parse("q").should_halt)
    proc = _started(small_engine, tmp_path / "serve.log", "--max-batch", "8")
    try:
        requests = [(a, min(a + 1 + a % 3, 64)) for a in range(0, 64, 2)]
        with ThreadPoolExecutor(8) as pool:
            futures = {
                (a, b): pool.submit(
                    infer_remote, proc.url, {"inputs": tokens[a:b], "puzzle_identifiers": ids[a:b]}, timeout_s=120
                )
                for a, b in requests
            }
            for (a, b), future in futures.items():
                out = future.result(timeout=300)
                assert np.array_equal(out["answer"], ref["logits"][a:b].argmax(-1)), a
                assert np.array_equal(out["steps"], ref["steps_used"][a:b]), a
                assert np.abs(out["logits"] - ref["logits"][a:b]).max() < 1e-4  # CPU kernels round by batch size
        assert gauges(proc)["step_calls_total"] < sum(ref["steps_used"]), "puzzles never shared a step"
    finally:
        _stop_clean(proc)
