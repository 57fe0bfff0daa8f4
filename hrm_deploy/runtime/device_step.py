"""A step engine behind the step contract (:class:`hrm_deploy.contract.StepFunction`): one ACT
segment per call on the device, with a per-row ``reset``, so the halting scheduler and in-flight
serving (:mod:`hrm_deploy.serve.inflight`) can drive TensorRT and PyTorch step engines as they
drive the ONNX step graph.

It uses the plans of its own :class:`~hrm_deploy.runtime.device_loop.DeviceLoop` (every buffer
allocated and bound once per bucket; the runner's loop keeps its plans for whole batches). The
carry never leaves the device: a :class:`DeviceCarry` names the plan whose carry buffers hold it,
which of the ping-pong pair is current (context 0 reads A and writes B, context 1 the reverse)
and how many rows are real. Shapes: B rows, P = the bucket (B <= P), S seq_len, V vocab.

- **Rows run in a bucket** (the next power of two within the profile). Padding rows start afresh
  every call (``reset`` True) on copies of the last real row and are never returned, so no halt
  rule sees them. When B moves to another bucket, the real rows' carry is copied (device to
  device) into the new plan's buffers.
- **take(rows)** (rows leave: halted, cancelled) copies the kept rows, run by run of consecutive
  rows, into the *other* carry buffer of the pair (no overlapping copy) and flips the pair.
- **join(carry, fresh)** (rows enter) only counts them: they run with ``reset`` True, so whatever
  their carry slots hold is never read.

Per call the host uploads inputs [P,S], the puzzle feed [P] and reset [P], runs one execute and
downloads q_halt / q_continue [P] and logits [P,S,V] (the last one widened to float32 on the host).
Where the memory backend and the engine allow (torch CUDA memory, TensorRT), the execute of each
(bucket, pair half) is captured once as a CUDA graph after an eager first run and replayed after,
as the whole-batch loop captures its step loop; a failed capture warns once and stays eager.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from hrm_deploy.contract import CARRY, FEEDS, Q_LOGITS, RESET
from hrm_deploy.errors import ConfigError, InternalError
from hrm_deploy.runtime.device_loop import DeviceLoop, bucket
from hrm_deploy.runtime.memory import to_float32

if TYPE_CHECKING:
    from hrm_deploy.runtime.device_loop import _Plan


@dataclass(frozen=True)
class DeviceCarry:
    """Where a :class:`DeviceStep`'s carry lives: ``plan`` (None: no row has run yet), the current
    buffer of its ping-pong pair (``parity`` 0: A, 1: B) and the number of rows."""

    plan: _Plan | None
    parity: int
    rows: int


class DeviceStep:
    """One ACT step of a step engine per call (see the module docstring), on ``loop``'s plans (its
    ``cuda_graph`` says whether each bucket's step is captured). ``puzzle_table``: the host table of
    an engine built from an ``--puzzle-emb external`` export (ids -> rows)."""

    def __init__(self, loop: DeviceLoop, puzzle_table: Any = None):
        if loop.mode != "step":
            raise ConfigError(
                "this engine is unrolled (it runs every ACT step in one call); export --mode step and build "
                "that for per-step scheduling"
            )
        self.loop, self.memory, self.puzzle_table = loop, loop.memory, puzzle_table
        self.steps = loop.steps
        self.low, self.high = loop.adapter.batch_range

    # -- the carry ------------------------------------------------------------------------
    def initial_carry(self, batch: int) -> DeviceCarry:
        return DeviceCarry(None, 0, int(batch))

    def join(self, carry: DeviceCarry, fresh: DeviceCarry) -> DeviceCarry:
        """``carry``'s rows, then ``fresh``'s (rows that run with ``reset`` True next)."""
        return DeviceCarry(carry.plan, carry.parity, carry.rows + fresh.rows)

    def _buffers(self, plan: _Plan, parity: int) -> list[Any]:
        suffix = "" if parity == 0 else "_b"
        return [plan.device[name + suffix] for name in CARRY]

    def _copy_rows(self, dst: list[Any], src: list[Any], pairs: list[tuple[int, int, int]]) -> None:
        """Device copies of row runs: (src start, dst start, length) for each carry tensor."""
        memory = self.memory
        with memory.on_stream():
            for d, s in zip(dst, src):
                for start, to, n in pairs:
                    memory.copy(memory.rows(d, to, to + n), memory.rows(s, start, start + n))

    def take(self, carry: DeviceCarry, rows: np.ndarray) -> DeviceCarry:
        """The carry of ``rows`` (indices into the carry, in that order), on the device."""
        rows = np.asarray(rows, dtype=np.int64)
        if carry.plan is None or len(rows) == 0:
            return DeviceCarry(carry.plan, carry.parity, len(rows))
        if np.array_equal(rows, np.arange(len(rows))):  # a prefix stays where it is
            return DeviceCarry(carry.plan, carry.parity, len(rows))
        # runs where both source and destination rows are consecutive: one copy each
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1
        starts = np.concatenate([[0], breaks])
        ends = np.concatenate([breaks, [len(rows)]])
        pairs = [(int(rows[a]), int(a), int(b - a)) for a, b in zip(starts, ends)]
        plan = carry.plan
        self._copy_rows(self._buffers(plan, 1 - carry.parity), self._buffers(plan, carry.parity), pairs)
        return DeviceCarry(plan, 1 - carry.parity, len(rows))

    def _plan_for(self, carry: DeviceCarry, rows: int) -> tuple[_Plan, int]:
        """The plan ``rows`` run in and the current half of its pair; a carry in another bucket's
        plan is copied over (its real rows only)."""
        if not 1 <= rows <= self.high:
            raise ConfigError(
                f"{rows} rows in one step, but the engine's profile takes batch {self.low}..{self.high}; "
                "use at most that many slots (serve --max-batch)"
            )
        size = bucket(rows, self.low, self.high) if self.loop.buckets else max(rows, self.low)
        old = carry.plan
        if old is not None and not old.contexts:
            raise InternalError("the plan holding the in-flight carry was released while rows were running")
        if old is not None and old.batch == size:
            return old, carry.parity
        plan = self.loop.plan(size, keep=old)
        if old is not None:  # bring the real rows along
            n = min(carry.rows, old.batch, size)
            self._copy_rows(self._buffers(plan, 0), self._buffers(old, carry.parity), [(0, 0, n)])
        return plan, 0

    # -- one step ---------------------------------------------------------------------------
    def __call__(
        self, inputs: np.ndarray, puzzle_ids: np.ndarray, carry: DeviceCarry, reset: np.ndarray
    ) -> tuple[DeviceCarry, np.ndarray, np.ndarray, np.ndarray]:
        """(inputs int32 [B,S], puzzle_ids int32 [B], carry, reset bool [B]) -> (carry, logits
        float32 [B,S,V], q_halt [B], q_continue [B]); rows with ``reset`` start afresh."""
        rows = len(inputs)
        plan, parity = self._plan_for(carry, rows)
        memory, device, stage, specs = self.memory, plan.device, plan.stage, self.loop.adapter.tensors
        feeds = dict(zip(FEEDS, (np.asarray(inputs), np.asarray(puzzle_ids))))
        if self.puzzle_table is not None:  # the rows of the batch's puzzles, gathered on the host
            feeds = self.puzzle_table.feeds(feeds)
        if "reset_rows" not in stage:
            stage["reset_rows"] = memory.staging(specs[RESET].at(plan.batch), specs[RESET].dtype)
        fresh = stage["reset_rows"]
        fresh[:rows] = np.asarray(reset, dtype=bool)
        fresh[rows:] = True  # padding rows never read a carry
        with memory.on_stream():
            self.loop.stage_feeds(plan, feeds, rows)
            for name in self.loop.feeds:
                memory.upload(device[name], stage[name])
            memory.upload(device[RESET], fresh)
            self._execute(plan, parity)  # reads the carry half `parity`, writes the other
            for name in Q_LOGITS:
                memory.download(stage[name], device[name])
            memory.download(stage["logits"], device["logits"])
            memory.synchronize()
        q_halt, q_continue = (to_float32(stage[name][:rows], specs[name].dtype).copy() for name in Q_LOGITS)
        logits = to_float32(stage["logits"][:rows], specs["logits"].dtype).copy()
        return DeviceCarry(plan, 1 - parity, rows), logits, q_halt, q_continue

    def _execute(self, plan: _Plan, parity: int) -> None:
        """One step on ``plan``'s context ``parity``: replayed from its graph once captured (after an
        eager first run, so this call's outputs exist either way; a failed capture leaves every
        later step eager, :meth:`DeviceLoop.capture`)."""
        graphs = plan.extra.setdefault("step_graphs", {})
        if parity in graphs:
            self.memory.replay(graphs[parity])
            return
        context, loop = plan.contexts[parity], self.loop
        loop.adapter.execute(context)
        loop.enqueued_steps += 1
        if loop.cuda_graph and loop.adapter.capturable(context):
            graph = loop.capture(lambda: loop.adapter.execute(context), "one ACT step")
            if graph is not None:
                graphs[parity] = graph

    def warm_up(self, max_batch: int | None = None) -> list[int]:
        """One step at every bucket that up to ``max_batch`` rows (default: the engine's largest)
        will use, with fresh padding rows: every plan allocated and its steps captured before the
        scheduler's first request. The loop keeps at least that many plans. Returns the sizes."""
        from hrm_deploy.runtime.device_loop import warm_sizes

        sizes = warm_sizes(self.low, self.high, max_batch)
        self.loop.max_plans = max(self.loop.max_plans, len(sizes))
        seq = self.loop.adapter.tensors["inputs"].shape[-1]
        for size in sizes:
            fresh = self.initial_carry(size)
            for _ in range(2):  # both halves of the ping-pong pair (each has its own graph)
                fresh = self(np.zeros((size, seq), np.int32), np.zeros(size, np.int32), fresh, np.ones(size, bool))[0]
        return sizes

    @property
    def cuda_graph(self) -> bool:
        """Whether steps are still captured (False for good after a failed capture)."""
        return bool(self.loop.cuda_graph)
