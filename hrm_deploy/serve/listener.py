"""The front's connections, bounded in everything a client controls: how many, how long, how much.

One event loop thread reads every connection (no thread per connection); complete requests go to a
bounded pool of worker threads. Per connection:

- the request line and headers must arrive within :attr:`Capacity.header_timeout_s` (a kept-alive
  connection waits at most :attr:`Capacity.idle_timeout_s` for its next request) and fit in
  :data:`HEADER_LIMIT` bytes (431 otherwise); the body within :attr:`Capacity.body_timeout_s`. A client past
  its deadline gets 408 and is closed: a slow or half-sent body holds one connection slot (a socket and at
  most the body limit of memory), never a thread, and only until its deadline;
- the application may refuse a request from its head alone (:meth:`App.admit`: body size, method),
  before the body is read;
- at most :attr:`Capacity.max_requests_per_connection` requests, then ``Connection: close``.

Past capacity a client is answered, never reset: beyond :attr:`Capacity.max_connections` open
connections, or with :attr:`Capacity.workers` + :attr:`Capacity.queue` requests already taken, it gets
503 with ``Retry-After``. A refused connection is closed only after the client's bytes are read (a close
with unread data sends a TCP reset, and the client would see that instead of the 503). The listen backlog
asks for :data:`BACKLOG` (the kernel caps it at ``net.core.somaxconn``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import http.client
import io
import json
import logging
import os
import resource
import socket
import threading
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol

log = logging.getLogger(__name__)

HEADER_LIMIT = 64 << 10  # request line + headers
BACKLOG = 65535  # the kernel caps the listen backlog at net.core.somaxconn (4096 on current Linux)
LINGER_S = 2.0  # how long a refused connection may keep sending before it is closed
_FD_RESERVE = 256  # descriptors left for tritonserver's proxies, model files, logs


@dataclass(frozen=True)
class Capacity:
    """How much the front holds at once, and how long a client may take (seconds)."""

    max_connections: int = 2048  # open connections: being read, answered, or kept alive
    workers: int = 64  # requests answered at once (threads)
    queue: int = 256  # complete requests waiting for a worker; past it, 503
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0  # also bounds writing an answer to a client that does not read
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
    headers: http.client.HTTPMessage
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


class App(Protocol):
    def admit(self, request: Request) -> Reply | None:
        """A refusal from the head alone (the body not read yet), or None. Runs in the event loop: must not block."""
        ...

    def handle(self, request: Request) -> Reply | None:
        """The answer (runs in a worker thread); None when the client has gone (the connection is closed)."""
        ...


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
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, sock=self.sock, limit=HEADER_LIMIT, backlog=BACKLOG)
        self._started.set()
        async with server:
            await self._stop.wait()
            server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            if self.open > self.capacity.max_connections:
                await self._refuse(reader, writer, "connections")
                return
            await self._requests(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        finally:
            self.open -= 1
            writer.close()

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, what: str) -> None:
        cap = self.capacity
        log.warning("front: at its limit of %s; answering 503", what)
        with contextlib.suppress(asyncio.TimeoutError, ValueError, asyncio.LimitOverrunError):
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 1.0)  # the client's request, if it comes
        message = f"the server is at its limit of {what}; retry after {cap.retry_after_s} s"
        await self._write(writer, Reply.error(503, message, {"Retry-After": str(cap.retry_after_s)}, close=True))
        await self._linger(reader, writer)

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Close without a reset: stop writing, read (and drop) what the client still sends, briefly."""
        with contextlib.suppress(OSError, RuntimeError):
            writer.write_eof()
        loop = asyncio.get_running_loop()
        end = loop.time() + LINGER_S
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
            while loop.time() < end:
                if not await asyncio.wait_for(reader.read(1 << 16), end - loop.time()):
                    break

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        cap = self.capacity
        for served in range(cap.max_requests_per_connection):
            timeout = cap.header_timeout_s if served == 0 else cap.idle_timeout_s
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
            except asyncio.TimeoutError:
                if served == 0:  # a kept-alive connection that stays quiet is simply closed
                    await self._write(
                        writer, Reply.error(408, "the request's headers did not arrive in time", close=True)
                    )
                return
            except asyncio.LimitOverrunError:
                await self._write(writer, Reply.error(431, f"request headers over {HEADER_LIMIT} bytes", close=True))
                return
            request, keep = _parse_head(head)
            if isinstance(request, Reply):
                await self._write(writer, request)
                await self._linger(reader, writer)
                return
            refused = self.app.admit(request)
            if refused is not None:  # the body is not read: the connection ends after the answer
                await self._write(writer, Reply(refused.status, refused.body, refused.headers, close=True))
                await self._linger(reader, writer)
                return
            late = await self._body(reader, writer, request)
            if late is not None:
                await self._write(writer, late)
                return
            reply = await self._answer(request, writer)
            if reply is None:  # the client has gone
                return
            keep = keep and not reply.close and served + 1 < cap.max_requests_per_connection
            await self._write(writer, reply if keep else Reply(reply.status, reply.body, reply.headers, close=True))
            if not keep:
                await self._linger(reader, writer)
                return

    async def _body(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: Request) -> Reply | None:
        """Reads the body into ``request``; a 408 reply (the connection closes) past the deadline."""
        length = int(request.headers.get("Content-Length") or 0)
        if request.headers.get("Expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        try:
            request.body = await asyncio.wait_for(reader.readexactly(length), self.capacity.body_timeout_s)
        except asyncio.TimeoutError:
            log.info("front: dropped a request whose body did not arrive in %.0f s", self.capacity.body_timeout_s)
            return Reply.error(408, f"the body did not arrive within {self.capacity.body_timeout_s:.0f} s", close=True)
        return None

    async def _answer(self, request: Request, writer: asyncio.StreamWriter) -> Reply | None:
        cap = self.capacity
        if self.taken >= cap.workers + cap.queue:
            log.warning("front: %d requests taken (its limit); answering 503", self.taken)
            message = f"the server is at its limit of {self.taken} requests; retry after {cap.retry_after_s} s"
            return Reply.error(503, message, {"Retry-After": str(cap.retry_after_s)})
        sock = writer.get_extra_info("socket")
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

    async def _write(self, writer: asyncio.StreamWriter, reply: Reply) -> None:
        status = HTTPStatus(reply.status)
        lines = [f"HTTP/1.1 {status.value} {status.phrase}"]
        lines += [f"{k}: {v}" for k, v in reply.headers if k.lower() not in ("content-length", "connection")]
        lines += [f"Content-Length: {len(reply.body)}"] + (["Connection: close"] if reply.close else [])
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + reply.body)
        try:
            await asyncio.wait_for(writer.drain(), self.capacity.body_timeout_s)
        except asyncio.TimeoutError:
            raise ConnectionAbortedError("the client did not read its answer in time") from None


def _parse_head(head: bytes) -> tuple[Request | Reply, bool]:
    """(the request, keep-alive) of a request line and headers; (a 400/431/505 reply, False) when malformed."""
    line, _, rest = head.lstrip(b"\r\n").partition(b"\r\n")
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return Reply.error(400, f"bad request line {line[:80]!r}", close=True), False
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        return Reply.error(505, f"{version} is not supported; use HTTP/1.1", close=True), False
    try:
        headers = http.client.parse_headers(io.BytesIO(rest))
    except http.client.HTTPException as exc:
        return Reply.error(431, f"bad request headers ({exc.__class__.__name__})", close=True), False
    connection = (headers.get("Connection") or "").lower()
    keep = "keep-alive" in connection if version == "HTTP/1.0" else "close" not in connection
    return Request(method, target, headers), keep
