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
  data (JSON or binary) of exactly that many elements, every value inside the model's vocabulary (puzzle
  identifiers inside their range; never wrapped to int32), a binary size that is an integer; requested
  outputs must exist. Any failure is HTTP 400 with Triton's error body ``{"error": "..."}`` naming the
  problem, in every batching mode;
- forwards everything else unchanged (health, metadata, statistics) and streams Triton's answer back.

With in-flight batching (:mod:`hrm_deploy.serve.endpoint`), checked inference requests for the
served model are answered by the front itself (each request alone, through the ACT loop), and
``GET /metrics`` on this port gives the loop's gauges.

Memory per request is bounded by the body limit, which follows from the model's largest batch. Connections,
workers and per-connection deadlines are bounded by :mod:`hrm_deploy.serve.listener`: past them 503 with
``Retry-After``, never a reset.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from hrm_deploy.serve.listener import Capacity, Listener, Reply, Request

log = logging.getLogger(__name__)

_INFER_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/[^/]+)?/infer/?$")
# A JSON token of an int32 costs at most 11 characters plus a separator; the header's own keys.
_BYTES_PER_ELEMENT = 12
_HEADER_SLACK = 64 << 10
_INT32_END = 2**31
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}
_BYTE_COUNT = re.compile(r"[0-9]{1,18}")  # ASCII digits only: str.isdigit() also takes '²' and other scripts' digits


def byte_count(headers: Any, name: str) -> int | None:
    """The value of header ``name`` in ``headers`` (aiohttp's, or any mapping with ``getall``) as a byte
    count; None when absent; :class:`Refused` (400) when it is repeated or not plain ASCII digits."""
    found = headers.getall(name, []) if hasattr(headers, "getall") else [headers.get(name)]
    values = [str(v) for v in found if v is not None]
    if not values:
        return None
    if len(values) > 1 or not _BYTE_COUNT.fullmatch(values[0].strip()):
        shown = ", ".join(repr(v) for v in values)
        raise Refused(400, f"{name} {shown} is not one byte count (ASCII digits); send it once, e.g. {name}: 1024")
    return int(values[0])


class _Upstream:
    """Kept-alive connections to Triton's HTTP endpoint, one per worker at a time; :meth:`close` ends
    them all (at a stop: a connection left open makes Triton wait its exit timeout for it)."""

    def __init__(self, port: int, timeout_s: float):
        self.port, self.timeout_s = port, timeout_s
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self.closed = False

    def take(self) -> tuple[http.client.HTTPConnection, bool]:
        """(a connection, whether it is new)."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), False
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout_s), True

    def give_back(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self.closed:
                self._idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()


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
    bounds: tuple[tuple[str, int], ...] = ()  # (name, values in 0..bound-1); default: the int32 range

    def bound(self, name: str) -> int:
        return dict(self.bounds).get(name, _INT32_END)

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
    rows, seen, binary_total, binary_inputs = limits.rows(), set(), 0, []
    for item in request["inputs"]:
        name = item.get("name") if isinstance(item, dict) else None
        if name not in rows or name in seen:
            raise Refused(400, f"input {name!r} is unknown or repeated; send each of {sorted(rows)} once")
        seen.add(name)
        count = _check_shape(name, item, rows[name], limits.max_batch)
        size = _check_data(name, item, count, limits.bound(name))
        if size:
            binary_inputs.append((name, len(body) - binary + binary_total, count))
        binary_total += size
    if seen != set(rows):
        raise Refused(400, f"missing input(s) {sorted(set(rows) - seen)}; send {sorted(rows)}")
    if binary_total != binary:
        raise Refused(400, f"binary data of {binary} bytes, but the inputs declare {binary_total}")
    for name, offset, count in binary_inputs:
        values = np.frombuffer(body, np.dtype("<i4"), count=count, offset=offset)
        _check_values(name, values, limits.bound(name), rows[name])
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


def _check_data(name: str, item: dict[str, Any], count: int, bound: int) -> int:
    """Bytes of binary data the input declares (0 for JSON data, whose element count and values are checked)."""
    params = item.get("parameters") or {}
    size = params.get("binary_data_size") if isinstance(params, dict) else None
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size != 4 * count:
            raise Refused(
                400, f"input '{name}' declares {size!r} bytes of binary data; its shape needs the integer {4 * count}"
            )
        return size
    leaves: list[int] = []
    try:
        integers = _leaves(item.get("data"), leaves)
    except RecursionError:  # nested deeper than any [B, S] tensor
        integers = False
    if not integers:
        raise Refused(400, f"input '{name}' holds values that are not integers; its shape needs {count} integers")
    if len(leaves) != count:
        raise Refused(400, f"input '{name}' holds {len(leaves)} values; its shape needs {count}")
    _check_values(name, leaves, bound, count // int(item["shape"][0]))
    return 0


def _check_values(name: str, values: list[int] | np.ndarray, bound: int, row: int) -> None:
    """Every value of input ``name`` in ``0..bound-1``, never wrapped to int32 (the lines of :mod:`.wire`)."""
    low, high = (min(values), max(values)) if isinstance(values, list) else (int(values.min()), int(values.max()))
    if low >= 0 and high < bound:  # the common case: no array of Python ints
        return
    flat = np.asarray(values, dtype=object if isinstance(values, list) else None)
    bad = np.flatnonzero((flat < 0) | (flat >= bound))
    if not len(bad):
        return
    value, at = flat[bad[0]], int(bad[0])
    if bound == _INT32_END:
        raise Refused(400, f"input '{name}' holds {value}, outside 0..{bound - 1}")
    if name == "inputs":
        raise Refused(
            400,
            f"token {value} at position {at % row} is outside the vocabulary 0..{bound - 1}; "
            "encode puzzles as the model's data",
        )
    raise Refused(400, f"puzzle identifier {value} is outside 0..{bound - 1}")


def _leaves(data: Any, out: list[int]) -> bool:
    """Appends the integer leaves of a (nested) JSON list to ``out``; False for anything else."""
    if isinstance(data, bool):
        return False
    if isinstance(data, int):
        out.append(data)
        return True
    return isinstance(data, list) and all(_leaves(x, out) for x in data)


class _App:
    """The front's answers (:class:`hrm_deploy.serve.listener.App`): checks, the local endpoint, or Triton."""

    def __init__(self, limits: Limits, backend_port: int, timeout_s: float, local: LocalInference | None):
        self.limits, self.backend_port, self.timeout_s, self.local = limits, backend_port, timeout_s, local
        self.stopping = False
        self.upstream = _Upstream(backend_port, timeout_s)

    def admit(self, request: Request) -> Reply | None:
        if self.stopping:  # after SIGTERM/SIGINT nothing new is taken (health included, so a balancer moves on)
            return Reply.error(
                503, "the server is stopping; send the request to another instance", {"Retry-After": "5"}
            )
        if request.method not in ("GET", "POST"):
            return Reply.error(501, f"method {request.method} is not supported; use GET or POST")
        if request.headers.get("Transfer-Encoding"):
            return Reply.error(411, "chunked bodies are not accepted; send a Content-Length")
        try:
            length = byte_count(request.headers, "Content-Length")
            byte_count(request.headers, "Inference-Header-Content-Length")
        except Refused as refused:
            return Reply.error(refused.status, str(refused), close=True)
        if length is None and request.method == "GET":
            return None
        if length is None:
            return Reply.error(411, "the request has no Content-Length; send one")
        if length > self.limits.max_body():
            return Reply.error(
                413,
                f"the request body of {int(length)} bytes exceeds this server's limit of "
                f"{self.limits.max_body()} bytes (max batch {self.limits.max_batch}); send smaller batches",
            )
        return None

    def handle(self, request: Request) -> Reply | None:
        path = request.target.split("?", 1)[0]
        if request.method == "GET" and self.local is not None and path == "/metrics":
            return Reply(200, self.local.metrics().encode(), (("Content-Type", "text/plain; version=0.0.4"),))
        match = _INFER_PATH.match(path) if request.method == "POST" else None
        if match is None:
            return self._forward(request)
        try:
            length = byte_count(request.headers, "Inference-Header-Content-Length")
            checked = check_infer_request(request.body, length, self.limits)
            if self.local is not None and match.group("name") == self.limits.model_name:
                reply = self.local.answer(checked, request.body, length, request.connection)
                return None if reply is None else Reply(reply[0], reply[1], tuple(reply[2].items()))
        except Refused as refused:
            log.info("refused a request: %s", refused)
            return Reply.error(refused.status, str(refused), refused.headers)
        return self._forward(request)

    def _forward(self, request: Request) -> Reply:
        # Content-Length is http.client's, from the body aiohttp read (one length, never the client's text)
        dropped = _HOP_HEADERS | {"host", "content-length"}
        headers = {k: v for k, v in request.headers.items() if k.lower() not in dropped}
        for attempt in range(2):  # a kept-alive connection Triton closed meanwhile is opened again once
            upstream, fresh = self.upstream.take()
            try:
                upstream.request(request.method, request.target, body=request.body or None, headers=headers)
                reply = upstream.getresponse()
                data = reply.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                upstream.close()
                if fresh or attempt:
                    return Reply.error(
                        503, f"the model server is not answering ({exc.__class__.__name__}); retry later"
                    )
        self.upstream.give_back(upstream)
        kept = tuple((k, v) for k, v in reply.getheaders() if k.lower() not in _HOP_HEADERS | {"content-length"})
        return Reply(reply.status, data, kept)


class Front:
    """The checking front on ``host:port`` for a tritonserver HTTP endpoint on 127.0.0.1:``backend_port``.

    Connections are bounded as :class:`~hrm_deploy.serve.listener.Capacity` says (by default sized from the
    model's largest batch): past them a client gets 503 with ``Retry-After``."""

    def __init__(
        self,
        host: str,
        port: int,
        backend_port: int,
        limits: Limits,
        timeout_s: float = 600.0,
        local: LocalInference | None = None,
        capacity: Capacity | None = None,
    ):
        self.app = _App(limits, backend_port, timeout_s, local)  # local: in-flight batching, answered here
        self.listener = Listener(host, port, self.app, capacity or Capacity.for_batch(limits.max_batch))

    def __enter__(self) -> Front:
        self.listener.start()
        return self

    def stop_accepting(self) -> None:
        """From now on every new request is answered 503, and the connections to Triton are closed as
        they come back (so Triton, stopping next, has none to wait for). Safe from a signal handler."""
        self.app.stopping = True
        self.app.upstream.close()

    def __exit__(self, *exc: object) -> None:
        self.listener.close()
