"""The HTTP front of ``hrm-deploy serve``: every request is checked before Triton sees it.

tritonserver allocates what a request declares before it looks at the data: a 700-byte POST
declaring shape ``[10**12, 81]`` aborts it (``std::bad_alloc``), and a 500 MB body is held in
memory whole. So ``serve`` binds tritonserver's HTTP endpoint to a private loopback port and
puts this front on the user's port. Per request it:

- refuses a body over :meth:`Limits.max_body` (HTTP 413) before reading it, and a body without a
  ``Content-Length`` (HTTP 411);
- parses an inference request's JSON header (the whole body, or the first
  ``Inference-Header-Content-Length`` bytes with the binary-data extension) and checks every input
  against the model: known name, ``INT32``, a shape of ``[B, S]`` with 1 <= B <= max batch, and
  data (JSON or binary) of exactly that many elements; requested outputs must exist. Any failure is
  HTTP 400 with Triton's error body ``{"error": "..."}`` naming the problem;
- forwards everything else unchanged (health, metadata, statistics) and streams Triton's answer back.

With in-flight batching (:mod:`hrm_deploy.serve.endpoint`), checked inference requests for the
served model are answered by the front itself (each request alone, through the ACT loop), and
``GET /metrics`` on this port gives the loop's gauges.

Memory per request is bounded by the body limit, which follows from the model's largest batch.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

log = logging.getLogger(__name__)

_INFER_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/[^/]+)?/infer/?$")
# A JSON token of an int32 costs at most 11 characters plus a separator; the header's own keys.
_BYTES_PER_ELEMENT = 12
_HEADER_SLACK = 64 << 10
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class Refused(Exception):
    """A request the front answers itself: HTTP ``status``, one line and extra headers (``Retry-After``)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers or {}


class LocalInference(Protocol):
    """Answers inference requests in the front itself (in-flight batching, :mod:`hrm_deploy.serve.endpoint`)."""

    def answer(
        self, request: dict[str, Any], body: bytes, header_length: int | None, connection: Any
    ) -> tuple[int, bytes, dict[str, str]] | None:
        """(status, body, headers) of the response; None when the client has gone (nothing to write)."""
        ...

    def metrics(self) -> str:
        """Prometheus text of the front's own gauges."""
        ...


@dataclass(frozen=True)
class Limits:
    """What a request to the served model may hold: its inputs' per-row shapes, the largest batch."""

    model_name: str
    seq_len: int
    max_batch: int
    inputs: tuple[tuple[str, int], ...] = ()  # (name, row length); default: inputs [S], puzzle_identifiers [1]
    outputs: tuple[str, ...] = ()

    def rows(self) -> dict[str, int]:
        return dict(self.inputs) or {"inputs": self.seq_len, "puzzle_identifiers": 1}

    def max_body(self) -> int:
        elements = self.max_batch * sum(self.rows().values())
        return _HEADER_SLACK + elements * _BYTES_PER_ELEMENT


def check_infer_request(body: bytes, header_length: int | None, limits: Limits) -> dict[str, Any]:
    """The request's JSON header; :class:`Refused` (400) unless ``body`` is an inference request the model can take."""
    if header_length is not None and not 0 < header_length <= len(body):
        raise Refused(400, f"Inference-Header-Content-Length {header_length} does not fit the body ({len(body)} bytes)")
    head, binary = (body[:header_length], len(body) - header_length) if header_length else (body, 0)
    try:
        request = json.loads(head)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise Refused(
            400, f"the request is not valid JSON ({exc.__class__.__name__}); send Triton's JSON form"
        ) from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise Refused(400, "the request has no 'inputs' list; send Triton's inference JSON")
    rows, seen, binary_total = limits.rows(), set(), 0
    for item in request["inputs"]:
        name = item.get("name") if isinstance(item, dict) else None
        if name not in rows or name in seen:
            raise Refused(400, f"input {name!r} is unknown or repeated; send each of {sorted(rows)} once")
        seen.add(name)
        count = _check_shape(name, item, rows[name], limits.max_batch)
        binary_total += _check_data(name, item, count)
    if seen != set(rows):
        raise Refused(400, f"missing input(s) {sorted(set(rows) - seen)}; send {sorted(rows)}")
    if binary_total != binary:
        raise Refused(400, f"binary data of {binary} bytes, but the inputs declare {binary_total}")
    for out in request.get("outputs") or []:
        name = out.get("name") if isinstance(out, dict) else None
        if limits.outputs and name not in limits.outputs:
            raise Refused(400, f"output {name!r} is unknown; ask for some of {list(limits.outputs)}")
    return request


def _check_shape(name: str, item: dict[str, Any], row: int, max_batch: int) -> int:
    if item.get("datatype") != "INT32":
        raise Refused(400, f"input '{name}' has datatype {item.get('datatype')!r}; send INT32")
    shape = item.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) != 2
        or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
        or shape[1] != row
        or not 1 <= shape[0] <= max_batch
    ):
        raise Refused(
            400, f"input '{name}' has shape {shape!r}; send [B, {row}] with 1 <= B <= {max_batch} (the server's batch)"
        )
    return shape[0] * row


def _check_data(name: str, item: dict[str, Any], count: int) -> int:
    """Bytes of binary data the input declares (0 for JSON data, whose element count is checked)."""
    params = item.get("parameters") or {}
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    if size is not None:
        if size != 4 * count:
            raise Refused(400, f"input '{name}' declares {size} bytes of binary data; its shape needs {4 * count}")
        return size
    data = item.get("data")
    if _count(data) != count:
        raise Refused(400, f"input '{name}' holds {_count(data)} values; its shape needs {count}")
    return 0


def _count(data: Any) -> int:
    """Integer leaves of a (nested) JSON list; -1 for anything else."""
    if isinstance(data, bool):
        return -1
    if isinstance(data, int):
        return 1
    if not isinstance(data, list):
        return -1
    total = 0
    for x in data:
        n = _count(x)
        if n < 0:
            return -1
        total += n
    return total


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = -1  # buffered: a response's head and body leave in one write (flushed after each request)
    server: _FrontServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("front: " + format, *args)

    def _stopping(self) -> bool:
        """After SIGTERM/SIGINT nothing new is taken: 503 (health included, so a balancer moves on)."""
        if not self.server.stopping:
            return False
        self.close_connection = True
        self._answer(
            503, {"error": "the server is stopping; send the request to another instance"}, {"Retry-After": "5"}
        )
        return True

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self._stopping():
            return
        local = self.server.local
        if local is not None and self.path.split("?", 1)[0] == "/metrics":
            self._reply(200, local.metrics().encode(), {"Content-Type": "text/plain; version=0.0.4"})
            return
        self._forward(b"")

    def do_POST(self) -> None:  # noqa: N802
        if self._stopping():
            return
        try:
            body = self._read_body()
            match = _INFER_PATH.match(self.path.split("?", 1)[0])
            if match:
                header = self.headers.get("Inference-Header-Content-Length")
                length = int(header) if header is not None and header.isdigit() else None
                if header is not None and length is None:
                    raise Refused(400, f"Inference-Header-Content-Length {header!r} is not a byte count")
                request = check_infer_request(body, length, self.server.limits)
                local = self.server.local
                if local is not None and match.group("name") == self.server.limits.model_name:
                    reply = local.answer(request, body, length, self.connection)
                    if reply is None:  # the client went away: nobody to answer
                        self.close_connection = True
                    else:
                        self._reply(*reply)
                    return
        except Refused as refused:
            log.info("refused a request: %s", refused)
            self._answer(refused.status, {"error": str(refused)}, refused.headers)
            return
        self._forward(body)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise Refused(411, "chunked bodies are not accepted; send a Content-Length")
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            raise Refused(411, "the request has no valid Content-Length")
        if int(length) > self.server.limits.max_body():
            self.close_connection = True  # the body is never read
            raise Refused(
                413,
                f"the request body of {int(length)} bytes exceeds this server's limit of "
                f"{self.server.limits.max_body()} bytes (max batch {self.server.limits.max_batch}); send smaller batches",
            )
        return self.rfile.read(int(length))

    def _answer(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self._reply(status, json.dumps(payload).encode(), {"Content-Type": "application/json", **(headers or {})})

    def _reply(self, status: int, data: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _forward(self, body: bytes) -> None:
        upstream = http.client.HTTPConnection("127.0.0.1", self.server.backend_port, timeout=self.server.timeout_s)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS | {"host"}}
            upstream.request(self.command, self.path, body=body or None, headers=headers)
            reply = upstream.getresponse()
            data = reply.read()
        except OSError as exc:
            self._answer(503, {"error": f"the model server is not answering ({exc.__class__.__name__}); retry later"})
            return
        finally:
            upstream.close()
        self.send_response(reply.status)
        for key, value in reply.getheaders():
            if key.lower() not in _HOP_HEADERS | {"content-length"}:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _FrontServer(ThreadingHTTPServer):
    daemon_threads = True
    stopping = False
    limits: Limits
    backend_port: int
    timeout_s: float
    local: LocalInference | None


class Front:
    """The checking front on ``host:port`` for a tritonserver HTTP endpoint on 127.0.0.1:``backend_port``."""

    def __init__(
        self,
        host: str,
        port: int,
        backend_port: int,
        limits: Limits,
        timeout_s: float = 600.0,
        local: LocalInference | None = None,
    ):
        import socket

        _FrontServer.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.server = _FrontServer((host, port), _Handler)
        self.server.limits, self.server.backend_port, self.server.timeout_s = limits, backend_port, timeout_s
        self.server.local = local  # in-flight batching: inference answered here, not by Triton
        self.thread = threading.Thread(target=self.server.serve_forever, name="hrm-deploy-front", daemon=True)

    def __enter__(self) -> Front:
        self.thread.start()
        return self

    def stop_accepting(self) -> None:
        """From now on every new request is answered 503 (safe to call from a signal handler)."""
        self.server.stopping = True

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
