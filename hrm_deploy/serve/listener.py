"""The front's connections, on aiohttp's HTTP server, bounded in everything a client controls.

HTTP framing (the request line, headers, ``Content-Length``, chunked bodies, keep-alive) is aiohttp's
(its llhttp parser, fuzzed and maintained upstream). Conflicting or repeated ``Content-Length``
headers, a length that is not ASCII digits, ``Transfer-Encoding`` beside ``Content-Length``, a
request line or header over :data:`HEADER_LIMIT` bytes: each is answered 400 (one JSON line) by the
parser, the connection closed, nothing forwarded. What this module adds, per connection:

- the first request's line and headers must arrive within :attr:`Capacity.header_timeout_s` (else
  408 and the connection closes); a kept-alive connection waits at most :attr:`Capacity.idle_timeout_s`
  for its next request (then it is closed); a body must arrive within :attr:`Capacity.body_timeout_s`
  (else 408). A slow or half-sent body holds one connection (a socket, at most the body limit of
  memory, a coroutine), never a thread, and only until its deadline;
- the application may refuse a request from its head alone (:meth:`App.admit`: body size, method)
  before the body is read; the rest of the body is then read and dropped (a close with unread data
  would send a TCP reset, and the client would see that instead of the answer);
- complete requests are answered by a bounded pool of worker threads (:meth:`App.handle`).

Past capacity a client is answered, never reset: beyond :attr:`Capacity.max_connections` open
connections (the extra connection's request head is read, 503 with ``Retry-After`` written, the
connection half-closed and drained), or with :attr:`Capacity.workers` + :attr:`Capacity.queue`
requests already taken, it gets 503 with ``Retry-After``. The listen backlog asks for :data:`BACKLOG`
(the kernel caps it at ``net.core.somaxconn``). :func:`raise_open_file_limit` lifts the process's
soft descriptor limit to its hard limit, which is what bounds :attr:`Capacity.max_connections`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import resource
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol

log = logging.getLogger(__name__)

HEADER_LIMIT = 64 << 10  # one request line or header line
BACKLOG = 65535  # the kernel caps the listen backlog at net.core.somaxconn (4096 on current Linux)
LINGER_S = 2.0  # how long a refused connection may keep sending before it is closed
_FD_RESERVE = 256  # descriptors left for tritonserver's proxies, model files, logs


def raise_open_file_limit() -> int:
    """Lift this process's soft limit on open files to its hard limit (each connection is a descriptor);
    returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # a container that forbids it: the soft limit stays
            pass
    return soft


@dataclass(frozen=True)
class Capacity:
    """How much the front holds at once, and how long a client may take (seconds)."""

    max_connections: int = 2048  # open connections: being read, answered, or kept alive
    workers: int = 64  # requests answered at once (threads)
    queue: int = 256  # complete requests waiting for a worker; past it, 503
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 15.0  # a kept-alive connection's wait for its next request
    max_requests_per_connection: int = 1000
    retry_after_s: int = 1

    @classmethod
    def for_batch(cls, max_batch: int) -> Capacity:
        """Enough workers to fill several batches (dynamic batching forms batches from concurrent
        requests; in-flight requests wait in a worker while their puzzles run) and as many connections
        as the process's descriptor limit allows, up to the default."""
        workers = max(32, 4 * max_batch)
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        fds = cls.max_connections if soft == resource.RLIM_INFINITY else max(64, (soft - _FD_RESERVE) // 2)
        return cls(workers=workers, queue=4 * workers, max_connections=min(cls.max_connections, fds))


@dataclass
class Request:
    """One HTTP request; ``connection`` is a duplicate of the client's socket while a worker answers it
    (to notice a client that left; reading from it would steal the client's bytes)."""

    method: str
    target: str
    headers: Mapping[str, str]
    body: bytes = b""
    connection: socket.socket | None = None


@dataclass(frozen=True)
class Reply:
    """What the front answers; ``close`` ends the connection after it."""

    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    close: bool = False

    @classmethod
    def error(cls, status: int, message: str, headers: dict[str, str] | None = None, close: bool = False) -> Reply:
        """Triton's error form: ``{"error": message}``."""
        items = (("Content-Type", "application/json"), *(headers or {}).items())
        return cls(status, json.dumps({"error": message}).encode(), items, close)

    def wire(self) -> bytes:
        """The whole response as bytes (for a connection aiohttp does not handle: past capacity)."""
        status = HTTPStatus(self.status)
        lines = [f"HTTP/1.1 {status.value} {status.phrase}", *(f"{k}: {v}" for k, v in self.headers)]
        lines += [f"Content-Length: {len(self.body)}", "Connection: close"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


class App(Protocol):
    def admit(self, request: Request) -> Reply | None:
        """A refusal from the head alone (the body not read yet), or None. Runs in the event loop: must not block."""
        ...

    def handle(self, request: Request) -> Reply | None:
        """The answer (runs in a worker thread); None when the client has gone (the connection is closed)."""
        ...


def _one_line(exc: BaseException | None, status: int) -> str:
    """aiohttp's parser errors (``400, message: ...`` over several lines) as one line."""
    text = getattr(exc, "message", None) or (str(exc) if exc else "") or HTTPStatus(status).phrase
    first = " ".join(str(text).split())
    return first[:300]


def aiohttp_errors() -> type[Exception]:
    """What aiohttp raises when a body cannot be read because its connection closed."""
    from aiohttp import ClientConnectionError

    return ClientConnectionError


def _aiohttp_handler_class() -> Any:
    from aiohttp import web
    from aiohttp.web_protocol import RequestHandler

    class Handler(RequestHandler):  # type: ignore[misc]
        """aiohttp's connection handler, with the first request's header deadline and one-line errors."""

        listener: Listener

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self.started_requests = 0
            self.deadline = asyncio.get_running_loop().call_later(
                self.listener.capacity.header_timeout_s, self._headers_late, transport
            )

        def connection_lost(self, exc: BaseException | None) -> None:
            self.deadline.cancel()
            self.listener.open -= 1
            super().connection_lost(exc)

        def _headers_late(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            if self.started_requests == 0 and not transport.is_closing():
                reply = Reply.error(408, "the request's headers did not arrive in time", close=True)
                transport.write(reply.wire())
                transport.close()

        def handle_error(
            self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
        ) -> Any:
            if status >= 500:  # an internal bug: its traceback in the log, the client gets one line
                log.error("front: a request failed", exc_info=exc)
                reply = Reply.error(status, "internal error in the server's front; see the server's log")
            else:
                line = _one_line(exc, status)
                log.info("front: refused a malformed request (%d): %s", status, line)
                reply = Reply.error(status, f"malformed HTTP request: {line}")
            response = web.Response(status=status, body=reply.body, content_type="application/json")
            response.force_close()
            return response

    return Handler


class _Refuser(asyncio.Protocol):
    """A connection past :attr:`Capacity.max_connections`: its request head (or 1 s) is read, 503 with
    ``Retry-After`` written, the sending side closed, and what the client still sends read and dropped
    for up to :data:`LINGER_S` (a close with unread data would be a reset)."""

    def __init__(self, reply: Reply, on_lost: Any):
        self.reply, self.on_lost, self.seen = reply, on_lost, b""
        self.transport: asyncio.Transport | None = None
        self.answered = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        loop = asyncio.get_running_loop()
        loop.call_later(1.0, self._answer)
        loop.call_later(1.0 + LINGER_S, transport.close)

    def data_received(self, data: bytes) -> None:
        if not self.answered:
            self.seen = (self.seen + data)[-4:]
            if b"\r\n\r\n" in self.seen:
                self._answer()

    def _answer(self) -> None:
        if self.answered or self.transport is None or self.transport.is_closing():
            return
        self.answered = True
        self.transport.write(self.reply.wire())
        if self.transport.can_write_eof():
            self.transport.write_eof()

    def eof_received(self) -> bool | None:
        self._answer()
        if self.transport is not None:
            self.transport.close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_lost()


class Listener:
    """Serves ``app`` on ``host:port`` from a thread of its own until :meth:`close`. Binds at construction."""

    def __init__(self, host: str, port: int, app: App, capacity: Capacity):
        self.app, self.capacity = app, capacity
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, backlog=BACKLOG)
        self.open = 0  # connections (event loop thread only)
        self.taken = 0  # requests given to the pool and not yet answered (event loop thread only)
        self.pool = concurrent.futures.ThreadPoolExecutor(capacity.workers, thread_name_prefix="hrm-deploy-front")
        self.loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hrm-deploy-front", daemon=True)

    def start(self) -> None:
        self.thread.start()
        self._started.wait(10)

    def close(self) -> None:
        if self.thread.is_alive() and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
            self.thread.join(timeout=10)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.sock.close()

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()

    async def _main(self) -> None:
        from aiohttp.web_server import Server

        self._stop = asyncio.Event()
        cap = self.capacity
        # A handler runs to its end when its client leaves: a request already queued is then cancelled by
        # the application (it watches the connection), as it was before the front was on aiohttp.
        manager = Server(self._request, handler_cancellation=False)
        handler_class = _aiohttp_handler_class()
        handler_class.listener = self
        options: dict[str, Any] = {
            "keepalive_timeout": cap.idle_timeout_s,
            "access_log": None,
            "max_line_size": HEADER_LIMIT,
            "max_field_size": HEADER_LIMIT,
            "lingering_time": LINGER_S,
            "auto_decompress": False,  # a compressed body would slip past the size limit
        }
        busy = Reply.error(
            503,
            f"the server is at its limit of connections; retry after {cap.retry_after_s} s",
            {"Retry-After": str(cap.retry_after_s)},
        )

        def lost() -> None:
            self.open -= 1

        def protocol() -> asyncio.Protocol:
            self.open += 1
            if self.open > cap.max_connections:
                log.warning("front: at its limit of %d connections; answering 503", cap.max_connections)
                return _Refuser(busy, lost)
            return handler_class(manager, loop=asyncio.get_running_loop(), **options)  # type: ignore[no-any-return]

        server = await asyncio.get_running_loop().create_server(protocol, sock=self.sock, backlog=BACKLOG)
        self._started.set()
        async with server:
            await self._stop.wait()
            server.close()
            # an idle kept-alive connection closes now, a busy one after its reply
            for connection in list(manager.connections):
                connection.close()
            await manager.shutdown(1.0)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _request(self, raw: Any) -> Any:
        """aiohttp's handler: deadlines, the app's checks, a worker thread, the answer."""
        from aiohttp import web

        raw.protocol.started_requests += 1
        raw.protocol.deadline.cancel()
        cap = self.capacity
        request = Request(raw.method, raw.rel_url.raw_path_qs, raw.headers)
        if raw.version not in ((1, 0), (1, 1)):
            reply: Reply | None = Reply.error(
                505, f"HTTP/{raw.version[0]}.{raw.version[1]} is not supported; use HTTP/1.1"
            )
        else:
            reply = self.app.admit(request)
        if reply is None:
            if raw.headers.get("Expect", "").lower() == "100-continue":
                await raw.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                request.body = await asyncio.wait_for(raw.read(), cap.body_timeout_s)
            except asyncio.TimeoutError:
                log.info("front: dropped a request whose body did not arrive in %.0f s", cap.body_timeout_s)
                reply = Reply.error(408, f"the body did not arrive within {cap.body_timeout_s:.0f} s", close=True)
            except (ConnectionError, aiohttp_errors()) as exc:  # the client left before its body was sent
                log.debug("front: a client left mid-body: %s", exc)
                raw.protocol.force_close()
                return web.Response(status=204)
        if reply is None:
            reply = await self._answer(request, raw)
            if reply is None:  # the client has gone
                raw.protocol.force_close()
                return web.Response(status=204)
        response = web.Response(
            status=reply.status,
            body=reply.body,
            headers={k: v for k, v in reply.headers if k.lower() not in ("content-length", "connection")},
        )
        if reply.close or raw.protocol.started_requests >= cap.max_requests_per_connection:
            response.force_close()
        return response

    async def _answer(self, request: Request, raw: Any) -> Reply | None:
        cap = self.capacity
        if self.taken >= cap.workers + cap.queue:
            log.warning("front: %d requests taken (its limit); answering 503", self.taken)
            message = f"the server is at its limit of {self.taken} requests; retry after {cap.retry_after_s} s"
            return Reply.error(503, message, {"Retry-After": str(cap.retry_after_s)})
        sock = raw.transport.get_extra_info("socket") if raw.transport is not None else None
        self.taken += 1
        try:
            request.connection = socket.socket(fileno=os.dup(sock.fileno())) if sock is not None else None
            return await asyncio.get_running_loop().run_in_executor(self.pool, self.app.handle, request)
        except Exception:  # an internal bug: its traceback in the log, the client gets one line
            log.exception("front: a request failed")
            return Reply.error(500, "internal error in the server's front; see the server's log", close=True)
        finally:
            self.taken -= 1
            if request.connection is not None:
                request.connection.close()  # before the connection's own close: a live duplicate would hold it open
