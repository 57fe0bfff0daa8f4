"""In-flight batching for recurrent models: one ACT loop that requests join and leave at step boundaries.

With early halting, puzzles need different numbers of ACT steps. A server that runs each formed
batch to its end makes the whole batch wait for its slowest puzzle while new requests queue. The
:class:`InflightScheduler` instead keeps one loop over a step function
(:class:`hrm_deploy.halting.StepFunction`: the ONNX step graph, a checkpoint's single segment, a
TensorRT or PyTorch step engine through :mod:`hrm_deploy.runtime.device_step`) with
up to ``slots`` rows. Request handlers put a request's puzzles on a bounded FIFO queue
(:meth:`InflightScheduler.submit`); at every step boundary the scheduler thread

1. hands the rows that halted (or reached the model's step count) back to their requests;
2. drops the rows of requests that were cancelled (client gone, timed out);
3. fills free slots from the queue, oldest puzzle first (``reset`` = True for those rows: the step
   function starts them from the model's initial carry);
4. runs the next step.

A request is answered when all its puzzles are done. The idle loop sleeps on a condition; a lone
request starts at once. Rows never interact inside the step function (every op is per row), so a
puzzle's answer does not depend on its slot-mates; artifacts whose numerics do (dynamic INT8:
activation scales over the whole batch) are refused by :func:`batch_independent`.

Shapes: S seq_len, V vocab, T = ``step_fn.steps``. Per request: ``logits`` float32 [n, S, V] of
each puzzle's halting step, ``q_halt_logits`` float32 [n, T] (NaN after a puzzle's last step),
``steps_used`` int32 [n] -- the keys of ``Runner.infer``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from hrm_deploy.contract import HaltFn
from hrm_deploy.errors import ConfigError

log = logging.getLogger(__name__)

LOG_EVERY_S = 60.0  # one line per minute under load
RATE_WINDOW_S = 60.0  # puzzles/s and the worst wait are over this window


class Busy(Exception):
    """The queue cannot take a request now (full, or the server is stopping): HTTP 503."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Ticket:
    """One request's puzzles on their way through the loop; :meth:`wait` for its outputs."""

    def __init__(self, tokens: np.ndarray, ids: np.ndarray, steps: int, deadline: float | None):
        self.tokens, self.ids = tokens, ids  # int32 [n, S], int32 [n]
        n = len(tokens)
        self.arrived, self.deadline = time.monotonic(), deadline
        self.logits: np.ndarray | None = None  # float32 [n, S, V], allocated at the first answer
        self.q_halt = np.full((n, steps), np.nan, np.float32)
        self.steps_used = np.zeros(n, np.int32)
        self.remaining = n
        self.error: str | None = None
        self.status = 200  # HTTP status of the error (500 internal, 503 stopping, 504 timed out)
        self.cancelled = False
        self.done = threading.Event()

    def wait(self, timeout_s: float) -> bool:
        return self.done.wait(timeout_s)

    def cancel(self) -> None:
        """The client is gone: its queued puzzles are skipped, its running rows dropped at the next step."""
        self.cancelled = True

    def outputs(self) -> dict[str, np.ndarray]:
        """``Runner.infer``'s keys for this request (after :meth:`wait` returned True without error)."""
        assert self.logits is not None
        return {"logits": self.logits, "q_halt_logits": self.q_halt, "steps_used": self.steps_used}

    def _fail(self, status: int, message: str) -> None:
        if not self.done.is_set():
            self.status, self.error = status, message
            self.done.set()


def batch_independent(manifest: dict[str, Any] | None) -> str | None:
    """Why a puzzle's answer from this artifact can depend on its batch-mates (None: it cannot)."""
    recipe = ((manifest or {}).get("recipe") or {}).get("int8")
    if recipe == "dynamic":
        return (
            "a dynamic-INT8 graph scales activations over the whole batch, so a puzzle's answer depends on the "
            "puzzles in the loop with it; build it with --cpu-int8 static or blockwise for in-flight serving"
        )
    return None


def _join(a: Any, b: Any) -> Any:
    """Concatenate two carries (tuples of numpy arrays or torch tensors) along the batch."""
    if isinstance(a[0], np.ndarray):
        return tuple(np.concatenate([x, y]) for x, y in zip(a, b))
    import torch

    return tuple(torch.cat([x, y]) for x, y in zip(a, b))


class InflightScheduler:
    """One thread owning ``step_fn``; see the module docstring. ``queue_limit`` counts puzzles."""

    def __init__(self, step_fn: Any, halt: HaltFn | None, slots: int, queue_limit: int):
        if slots < 1 or queue_limit < 1:
            raise ConfigError(f"in-flight batching needs slots >= 1 and a queue limit >= 1, got {slots}, {queue_limit}")
        self.step_fn, self.halt, self.slots, self.queue_limit = step_fn, halt, slots, queue_limit
        self.steps = int(step_fn.steps)
        self._cond = threading.Condition()
        self._queue: deque[tuple[Ticket, int]] = deque()  # (request, row) in arrival order
        self._stopping = False
        self._grace_end = math.inf
        # running rows (the loop's own; read by the gauges without the lock: plain ints)
        self._owner: list[tuple[Ticket, int]] = []
        self._step_of = np.zeros(0, np.int64)  # the step each row runs next (1-based)
        self._reset = np.zeros(0, bool)  # rows that start afresh at the next step
        self._carry: Any = None
        self.busy = 0
        # counters and windows for the gauges (under the lock)
        self.answered = self.steps_total = self.step_calls = self.requests_done = 0
        self.refused = {"full": 0, "stopping": 0}
        self._recent: deque[tuple[float, int, float]] = deque()  # (time, puzzles answered, queue wait)
        self._last_log, self._logged_answers = time.monotonic(), 0
        self.thread = threading.Thread(target=self._run, name="hrm-deploy-inflight", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ request side
    def submit(self, tokens: np.ndarray, ids: np.ndarray, deadline: float | None = None) -> Ticket:
        """Queue one checked request (int32 [n, S], int32 [n]); :class:`Busy` when it cannot be taken."""
        ticket = Ticket(tokens, ids, self.steps, deadline)
        with self._cond:
            if self._stopping:
                self.refused["stopping"] += 1
                raise Busy("the server is stopping; retry on another server or later", 5)
            if len(self._queue) + len(tokens) > self.queue_limit:
                self.refused["full"] += 1
                raise Busy(
                    f"the queue holds {len(self._queue)} puzzles (limit {self.queue_limit}); retry later",
                    self._retry_after(),
                )
            self._queue.extend((ticket, r) for r in range(len(tokens)))
            self._cond.notify()
        return ticket

    def _retry_after(self) -> int:
        rate = self._rate()
        return int(min(60, max(1, math.ceil(len(self._queue) / rate)))) if rate > 0 else 1

    def stop(self, grace_s: float) -> None:
        """Take no more requests, fail the queued ones (503), let running rows finish for up to
        ``grace_s`` seconds, fail what is left, and end the thread."""
        with self._cond:
            self._stopping = True
            self._grace_end = time.monotonic() + grace_s
            while self._queue:
                self._queue.popleft()[0]._fail(503, "the server is stopping; this request was not started")
            self._cond.notify()
        self.thread.join(timeout=grace_s + 30)

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._owner and not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping and (not self._owner or time.monotonic() > self._grace_end):
                    for ticket, _ in self._owner:
                        ticket._fail(503, "the server stopped before this request was finished")
                    self._owner, self.busy = [], 0
                    return
                self._drop_cancelled()
                joining = self._take_queued(self.slots - len(self._owner))
            if joining:
                self._join_rows(joining)
            if not self._owner:
                continue
            try:
                self._step()
            except Exception as exc:  # noqa: BLE001 - an internal error fails the running requests, not the server
                log.exception("in-flight step failed; failing the %d running puzzles", len(self._owner))
                for ticket, _ in self._owner:
                    ticket._fail(500, f"internal error in the ACT loop: {type(exc).__name__}: {exc}")
                self._owner, self._carry, self.busy = [], None, 0
                self._step_of, self._reset = np.zeros(0, np.int64), np.zeros(0, bool)
            self._maybe_log()

    def _drop_cancelled(self) -> None:
        now = time.monotonic()
        for ticket, _ in list(self._owner) + list(self._queue):
            if not ticket.done.is_set() and ticket.deadline is not None and now > ticket.deadline:
                ticket.cancel()
                ticket._fail(504, f"the request timed out after {now - ticket.arrived:.1f} s")
        # cancelled, or failed (a step error): the rest of such a request is not worth running
        if any(t.cancelled or t.error for t, _ in self._queue):
            self._queue = deque(item for item in self._queue if not (item[0].cancelled or item[0].error))
        keep = [i for i, (t, _) in enumerate(self._owner) if not (t.cancelled or t.error)]
        if len(keep) < len(self._owner):
            rows = np.asarray(keep, np.int64)
            self._carry = self.step_fn.take(self._carry, rows) if keep else None
            self._owner = [self._owner[i] for i in keep]
            self._step_of, self._reset = self._step_of[rows], self._reset[rows]
            self.busy = len(self._owner)

    def _take_queued(self, free: int) -> list[tuple[Ticket, int]]:
        joining = []
        now = time.monotonic()
        while free > 0 and self._queue:
            ticket, row = self._queue.popleft()
            if row == 0:  # the first puzzle of a request takes its slot: its queue wait ends
                self._recent.append((now, 0, now - ticket.arrived))
            joining.append((ticket, row))
            free -= 1
        return joining

    def _join_rows(self, joining: list[tuple[Ticket, int]]) -> None:
        fresh = self.step_fn.initial_carry(len(joining))
        join = getattr(self.step_fn, "join", _join)  # a device carry joins without copying (reset rows)
        self._carry = fresh if self._carry is None else join(self._carry, fresh)
        self._owner = self._owner + joining
        self._step_of = np.concatenate([self._step_of, np.ones(len(joining), np.int64)])
        self._reset = np.concatenate([self._reset, np.ones(len(joining), bool)])
        self.busy = len(self._owner)

    def _step(self) -> None:
        owner = self._owner
        inputs = np.stack([t.tokens[r] for t, r in owner])  # [B, S]
        ids = np.asarray([t.ids[r] for t, r in owner], np.int32)  # [B]
        self._carry, logits, q_halt, q_continue = self.step_fn(inputs, ids, self._carry, self._reset)
        self._reset = np.zeros(len(owner), bool)
        self.step_calls += 1
        stop = (
            np.zeros(len(owner), bool)
            if self.halt is None
            else np.asarray(self.halt(self._step_of, q_halt, q_continue), bool)
        )
        stop |= self._step_of >= self.steps
        answered, steps_sum = 0, 0
        for i, (ticket, row) in enumerate(owner):
            ticket.q_halt[row, self._step_of[i] - 1] = q_halt[i]
            if not stop[i]:
                continue
            if ticket.logits is None:
                ticket.logits = np.zeros((len(ticket.tokens), *logits.shape[1:]), np.float32)
            ticket.logits[row] = logits[i]
            ticket.steps_used[row] = self._step_of[i]
            ticket.remaining -= 1
            answered, steps_sum = answered + 1, steps_sum + int(self._step_of[i])
            if ticket.remaining == 0 and not ticket.done.is_set():
                ticket.done.set()
                self.requests_done += 1
        self._step_of = self._step_of + 1
        if stop.any():
            rows = np.flatnonzero(~stop)
            self._carry = self.step_fn.take(self._carry, rows) if len(rows) else None
            self._owner = [owner[i] for i in rows]
            self._step_of, self._reset = self._step_of[rows], self._reset[rows]
        self.busy = len(self._owner)
        if answered:
            with self._cond:
                self.answered += answered
                self.steps_total += steps_sum
                self._recent.append((time.monotonic(), answered, 0.0))

    # ------------------------------------------------------------------ gauges
    def _prune(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - RATE_WINDOW_S:
            self._recent.popleft()

    def _rate(self) -> float:
        now = time.monotonic()
        self._prune(now)
        if not self._recent:
            return 0.0
        span = max(1.0, now - self._recent[0][0])
        return sum(n for _, n, _ in self._recent) / span

    def gauges(self) -> dict[str, float]:
        """Slots busy, queue depth, steps per answer, puzzles/s and the worst queue wait (last minute)."""
        with self._cond:
            rate = self._rate()
            worst = max((w for _, _, w in self._recent), default=0.0)
            return {
                "slots": float(self.slots),
                "slots_busy": float(self.busy),
                "queue_puzzles": float(len(self._queue)),
                "queue_limit": float(self.queue_limit),
                "puzzles_per_second": rate,
                "steps_per_answer": self.steps_total / self.answered if self.answered else 0.0,
                "worst_wait_seconds": worst,
                "puzzles_answered_total": float(self.answered),
                "requests_answered_total": float(self.requests_done),
                "step_calls_total": float(self.step_calls),
                "refused_queue_full_total": float(self.refused["full"]),
                "refused_stopping_total": float(self.refused["stopping"]),
            }

    def _maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last_log < LOG_EVERY_S:
            return
        g = self.gauges()
        if g["puzzles_answered_total"] > self._logged_answers:
            log.info(
                "in-flight: %.1f puzzles/s, %d/%d slots busy, %d queued, %.2f steps per answer, worst wait %.3f s",
                g["puzzles_per_second"],
                g["slots_busy"],
                g["slots"],
                g["queue_puzzles"],
                g["steps_per_answer"],
                g["worst_wait_seconds"],
            )
        self._last_log, self._logged_answers = now, int(g["puzzles_answered_total"])


def prometheus_text(gauges: dict[str, float], model_name: str) -> str:
    """The gauges in Prometheus' text format (``hrm_inflight_*{model="..."}``)."""
    lines = []
    for key, value in gauges.items():
        name = f"hrm_inflight_{key}"
        kind = "counter" if key.endswith("_total") else "gauge"
        lines += [f"# TYPE {name} {kind}", f'{name}{{model="{model_name}"}} {value:.6g}']
    return "\n".join(lines) + "\n"
