"""The checking front in process, in front of a small stand-in for tritonserver's HTTP endpoint.

Fast and bounded: every socket has a timeout. The same limits against the real tritonserver are
in tests/serve/test_front_load.py (slow)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from hrm_deploy.serve.front import Front, Limits, Refused, check_infer_request
from hrm_deploy.serve.listener import Capacity
from tests.serve.helpers import free_ports

LIMITS = Limits("hrm", 4, 2, bounds=(("inputs", 11), ("puzzle_identifiers", 3)))


def _request(tokens: Any, ids: Any = None, **inputs_extra: Any) -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "inputs", "shape": [1, 4], "datatype": "INT32", "data": tokens, **inputs_extra},
            {"name": "puzzle_identifiers", "shape": [1, 1], "datatype": "INT32", "data": ids or [0]},
        ]
    }


@pytest.mark.parametrize(
    "tokens,ids,needle",
    [
        ([2**32 + 5, 1, 1, 1], None, "token 4294967301 at position 0 is outside the vocabulary 0..10"),
        ([1, 11, 1, 1], None, "token 11 at position 1 is outside the vocabulary 0..10"),
        ([-1, 1, 1, 1], None, "token -1 at position 0 is outside the vocabulary"),
        ([1, 1, 1, 1], [3], "puzzle identifier 3 is outside 0..2"),
        ([1.5, 1, 1, 1], None, "not integers"),
    ],
)
def test_values_outside_int32_or_the_vocabulary_are_refused(tokens, ids, needle):
    with pytest.raises(Refused) as refused:
        check_infer_request(json.dumps(_request(tokens, ids)).encode(), None, LIMITS)
    assert refused.value.status == 400 and needle in str(refused.value)


def _binary(size: Any, values: np.ndarray) -> tuple[bytes, int]:
    request = _request(None)
    request["inputs"][0].pop("data")
    request["inputs"][0]["parameters"] = {"binary_data_size": size}
    head = json.dumps(request).encode()
    return head + values.astype("<i4").tobytes(), len(head)


def test_binary_sizes_must_be_integers_and_binary_values_in_the_vocabulary():
    body, length = _binary(16.0, np.ones(4))
    with pytest.raises(Refused, match=r"declares 16.0 bytes of binary data; its shape needs the integer 16"):
        check_infer_request(body, length, LIMITS)
    body, length = _binary(16, np.array([1, 2, 99, 3]))
    with pytest.raises(Refused, match="token 99 at position 2 is outside the vocabulary 0..10"):
        check_infer_request(body, length, LIMITS)
    body, length = _binary(16, np.array([1, 2, 10, 3]))
    assert check_infer_request(body, length, LIMITS)["inputs"][0]["name"] == "inputs"


class _Backend(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        getattr(self.server, "requests", []).append(f"GET {self.path}")
        self._send(b'{"ready": true}')

    def do_POST(self) -> None:  # noqa: N802
        getattr(self.server, "requests", []).append(f"POST {self.path}")
        self._send(self.rfile.read(int(self.headers["Content-Length"])))

    def _send(self, data: bytes) -> None:
        self.server.gate.wait(20)  # type: ignore[attr-defined]  # a test holds answers here
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def backend():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Backend)
    server.daemon_threads = True
    server.gate = threading.Event()  # type: ignore[attr-defined]
    server.gate.set()  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _front(backend, **capacity: Any) -> Front:
    (port,) = free_ports(1)
    cap = Capacity(**{"workers": 4, "queue": 4, **capacity})
    return Front("127.0.0.1", port, backend.server_address[1], LIMITS, timeout_s=10, capacity=cap)


def _get(port: int, path: str = "/v2/health/ready") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        return reply.status, dict(reply.getheaders()), reply.read()
    finally:
        conn.close()


def test_requests_are_forwarded_on_a_kept_alive_connection(backend):
    with _front(backend) as front:
        port = front.listener.sock.getsockname()[1]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        body = json.dumps(_request([1, 2, 3, 4])).encode()
        for _ in range(3):  # one connection, three answers
            conn.request("POST", "/v2/models/hrm/infer", body=body)
            reply = conn.getresponse()
            assert reply.status == 200 and reply.read() == body
        conn.request("POST", "/v2/models/hrm/infer", body=json.dumps(_request([1, 2, 3, 2**32])).encode())
        reply = conn.getresponse()
        assert reply.status == 400 and b"outside the vocabulary" in reply.read()
        conn.close()


def test_past_its_connections_a_client_gets_503_with_retry_after_not_a_reset(backend):
    with _front(backend, max_connections=3, header_timeout_s=5) as front:
        port = front.listener.sock.getsockname()[1]
        held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
        try:
            time.sleep(0.2)
            status, headers, body = _get(port)
            assert status == 503 and headers.get("Retry-After") == "1", (status, headers)
            assert b"limit of connections" in body
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 10  # the closed connections leave their slots
        while _get(port)[0] != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _get(port)[0] == 200


def test_past_its_workers_and_queue_a_request_gets_503(backend):
    backend.gate.clear()  # the one worker's request waits upstream until the refusals are seen
    with _front(backend, workers=1, queue=1) as front:
        port = front.listener.sock.getsockname()[1]
        results: list[int] = []
        threads = [threading.Thread(target=lambda: results.append(_get(port)[0])) for _ in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while results.count(503) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        backend.gate.set()
        for t in threads:
            t.join(20)
        assert sorted(results) == [200, 200, 503, 503], results


@pytest.mark.slow
def test_a_half_sent_body_is_dropped_at_its_deadline_and_holds_no_worker(backend):
    with _front(backend, workers=1, queue=0, body_timeout_s=0.5, header_timeout_s=0.5) as front:
        port = front.listener.sock.getsockname()[1]
        slow = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
        for sock in slow:
            sock.sendall(b"POST /v2/models/hrm/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        silent = socket.create_connection(("127.0.0.1", port), timeout=5)  # not even a header
        start = time.monotonic()
        assert _get(port)[0] == 200  # the one worker is free (no queue: a held worker would mean 503)
        for sock in [*slow, silent]:
            answer = sock.recv(4096)  # 408 at the deadline, then the connection closes
            assert b" 408 " in answer.split(b"\r\n")[0], answer
            assert sock.recv(4096) == b""
            sock.close()
        assert time.monotonic() - start < 5  # each dropped at its 0.5 s deadline, not held


def test_a_stopping_front_answers_503(backend):
    with _front(backend) as front:
        front.stop_accepting()
        status, headers, _ = _get(front.listener.sock.getsockname()[1])
        assert status == 503 and "Retry-After" in headers


def test_data_nested_past_the_recursion_limit_is_400():
    import inspect
    import sys

    # parses, but deeper than the checks may walk (the frames under this test counted: a test
    # worker's are many more than a plain run's)
    depth = sys.getrecursionlimit() - len(inspect.stack(0)) - 50
    data = "[" * depth + "1" + "]" * depth
    body = json.dumps(_request([1, 1, 1, 1])).replace("[1, 1, 1, 1]", data, 1).encode()
    try:
        json.loads(body)
    except RecursionError:
        pytest.skip("this Python's JSON parser stops earlier")
    with pytest.raises(Refused, match="not integers"):
        check_infer_request(body, None, LIMITS)


def _raw(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; everything the front answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    "head",
    [
        "Content-Length: {n}\r\nContent-Length: 5",  # conflicting lengths: the classic smuggling shape
        "Content-Length: {n}\r\nContent-Length: {n}",  # repeated
        "Content-Length: \u00b2",  # a Unicode digit (str.isdigit() takes it)
        "Content-Length: {n}\r\nTransfer-Encoding: chunked",
        "Content-Length: {n}\r\nInference-Header-Content-Length: \u00b2",
        "Content-Length: {n}\r\nInference-Header-Content-Length: 5\r\nInference-Header-Content-Length: 5",
    ],
)
def test_ambiguous_framing_is_400_and_never_forwarded(backend, head):
    body = json.dumps(_request([1, 2, 3, 4])).encode()
    seen = backend.requests = []  # type: ignore[attr-defined]
    with _front(backend) as front:
        port = front.listener.sock.getsockname()[1]
        text = f"POST /v2/models/hrm/something HTTP/1.1\r\nHost: x\r\n{head.format(n=len(body))}\r\n\r\n"
        answer = _raw(port, text.encode() + body)
        status_line, _, rest = answer.partition(b"\r\n")
        assert b" 400 " in status_line, answer[:300]
        assert len(json.loads(rest.split(b"\r\n\r\n", 1)[1])["error"].splitlines()) == 1
        assert _get(port)[0] == 200  # the front goes on
    assert not [r for r in seen if r.startswith("POST")], seen  # nothing reached the backend
