"""The in-flight inference endpoint: HTTP requests answered by the front through the ACT loop.

Each request is decoded and checked alone (:mod:`hrm_deploy.serve.wire`), its puzzles queued on the
:class:`~hrm_deploy.serve.inflight.InflightScheduler`, and the handler thread waits for them:

- a full queue (or a stopping server) answers HTTP 503 with ``Retry-After``;
- a client that disconnects while waiting cancels its puzzles (queued ones are skipped, running
  rows leave the loop at the next step);
- the request's own ``timeout`` parameter (microseconds, sent by ``tritonclient``'s ``timeout=``)
  or the server's limit bounds the wait: HTTP 504 after it.

The same scheduler answers gRPC requests that reach Triton (:class:`InflightInfer`, the function
bound into PyTriton); those are batched by Triton first, so a refused gRPC request fails its batch.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Any

import numpy as np

from hrm_deploy.serve.front import Refused
from hrm_deploy.serve.inflight import Busy, InflightScheduler, Ticket, prometheus_text
from hrm_deploy.serve.wire import (
    RequestError,
    check_feeds,
    check_requests,
    decode_request,
    encode_response,
    parameters,
    split_outputs,
)

POLL_S = 0.05  # how often a waiting handler looks at its client's socket (a select, ~10 us)


class ModelShape:
    """What a request is checked against: the model's sizes and its full ACT step count."""

    def __init__(self, model_name: str, seq_len: int, vocab_size: int, num_puzzle_identifiers: int, act_steps: int):
        self.model_name, self.seq_len, self.vocab_size = model_name, seq_len, vocab_size
        self.num_puzzle_identifiers, self.act_steps = num_puzzle_identifiers, act_steps

    def check(self, index: int, tokens: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return check_feeds(index, tokens, ids, self.seq_len, self.vocab_size, self.num_puzzle_identifiers)


def client_gone(connection: Any) -> bool:
    """True when the peer closed ``connection`` (readable with nothing to read); pipelined data is not 'gone'."""
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        return bool(readable) and connection.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def _wait(ticket: Ticket, limit_s: float, connection: Any = None) -> bool:
    """Wait for ``ticket``; False (ticket cancelled) when the client left or ``limit_s`` passed."""
    end = time.monotonic() + limit_s
    while not ticket.wait(POLL_S):
        if (connection is not None and client_gone(connection)) or time.monotonic() > end:
            ticket.cancel()
            return False
    return True


class InflightEndpoint:
    """The front's :class:`~hrm_deploy.serve.front.LocalInference` for in-flight batching."""

    def __init__(self, scheduler: InflightScheduler, shape: ModelShape, timeout_s: float = 600.0):
        self.scheduler, self.shape, self.timeout_s = scheduler, shape, timeout_s
        self.active = 0  # handlers between submit and reply (SIGTERM waits for them)
        self._lock = threading.Lock()
        self.client_gone = self.timed_out = 0

    def answer(
        self, request: dict[str, Any], body: bytes, header_length: int | None, connection: Any
    ) -> tuple[int, bytes, dict[str, str]] | None:
        try:
            arrays = decode_request(request, body, header_length)
            tokens, ids = self.shape.check(0, arrays["inputs"], arrays["puzzle_identifiers"])
        except RequestError as exc:
            raise Refused(400, str(exc).removeprefix("request 0: ")) from None
        timeout_us = parameters(request).get("timeout")
        limit_s = self.timeout_s
        if isinstance(timeout_us, int) and not isinstance(timeout_us, bool) and timeout_us > 0:
            limit_s = min(limit_s, timeout_us / 1e6)
        with self._lock:
            self.active += 1
        try:
            try:
                ticket = self.scheduler.submit(tokens, ids, deadline=time.monotonic() + limit_s)
            except Busy as busy:
                raise Refused(503, str(busy), {"Retry-After": str(busy.retry_after_s)}) from None
            if not _wait(ticket, limit_s + 1.0, connection):
                if not ticket.done.is_set():
                    self.client_gone += 1
                    return None
            if ticket.error is not None:
                self.timed_out += ticket.status == 504
                raise Refused(ticket.status, ticket.error)
            (outputs,) = split_outputs(ticket.outputs(), [len(tokens)], self.shape.act_steps)
            return (200, *encode_response(request, self.shape.model_name, outputs))
        finally:
            with self._lock:
                self.active -= 1

    def metrics(self) -> str:
        gauges = {
            **self.scheduler.gauges(),
            "clients_gone_total": float(self.client_gone),
            "timed_out_total": float(self.timed_out),
        }
        return prometheus_text(gauges, self.shape.model_name)

    def drain(self, grace_s: float) -> None:
        """SIGTERM: stop the loop (queued requests get 503, running ones finish within ``grace_s``),
        then give the handlers a moment to write their answers."""
        self.scheduler.stop(grace_s)
        end = time.monotonic() + 5.0
        while self.active and time.monotonic() < end:
            time.sleep(0.02)


class InflightInfer:
    """The function bound into PyTriton in in-flight mode (gRPC clients): each request of Triton's
    batch goes through the same ACT loop."""

    def __init__(self, scheduler: InflightScheduler, shape: ModelShape, timeout_s: float = 600.0):
        self.scheduler, self.shape, self.timeout_s = scheduler, shape, timeout_s

    def __call__(self, requests: list[Any]) -> list[dict[str, np.ndarray]]:
        shape = self.shape
        checked = check_requests(requests, shape.seq_len, shape.vocab_size, shape.num_puzzle_identifiers)
        tickets = []
        for tokens, ids in checked:
            try:
                tickets.append(self.scheduler.submit(tokens, ids, deadline=time.monotonic() + self.timeout_s))
            except Busy as busy:
                for ticket in tickets:
                    ticket.cancel()
                raise RequestError(str(busy)) from None
        responses = []
        for ticket in tickets:
            if not _wait(ticket, self.timeout_s + 1.0) or ticket.error is not None:
                raise RequestError(ticket.error or "timed out in the in-flight loop")
            responses += split_outputs(ticket.outputs(), [len(ticket.tokens)], self.shape.act_steps)
        return responses
