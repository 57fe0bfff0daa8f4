"""The host-side step driver and continuous batching over any :class:`StepFunction` (one ACT
segment per call: the ONNX Runtime step graph, the PyTorch reference's single segment).

Shapes: B rows, S = seq_len, V = vocab, T = steps. Carries are opaque to the driver (a tuple
of batch-first arrays or tensors); a :class:`StepFunction` knows how to make and slice them."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from hrm_deploy.contract import CARRY, FEEDS, RESET, STEP_OUTPUTS, HaltFn
from hrm_deploy.errors import ConfigError
from hrm_deploy.halting.rules import HaltRule


# --------------------------------------------------------------------------------- the step protocol
class StepFunction(Protocol):
    """One ACT segment per call. ``steps`` is the model's ``halt_max_steps``."""

    steps: int

    def initial_carry(self, batch: int) -> Any: ...

    def take(self, carry: Any, rows: np.ndarray) -> Any:
        """The carry of ``rows`` (int64 indices) only, in that order."""
        ...

    def __call__(
        self, inputs: np.ndarray, puzzle_ids: np.ndarray, carry: Any, reset: np.ndarray
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        """(inputs int32 [B,S], puzzle_ids int32 [B], carry, reset bool [B]) -> (carry,
        logits float32 [B,S,V], q_halt [B], q_continue [B]); rows with reset start afresh."""
        ...


class OrtStep:
    """The exported single-step graph on an ONNX Runtime session; carry = (z_H, z_L) float32."""

    def __init__(self, session: Any, steps: int):
        self.session, self.steps = session, steps
        dims = next(i.shape for i in session.get_inputs() if i.name == CARRY[0])
        self._state = (int(dims[1]), int(dims[2]))

    def initial_carry(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        return (np.zeros((batch, *self._state), np.float32), np.zeros((batch, *self._state), np.float32))

    def take(self, carry: Any, rows: np.ndarray) -> Any:
        return tuple(c[rows] for c in carry)

    def __call__(self, inputs, puzzle_ids, carry, reset):
        feeds = dict(zip(FEEDS, (inputs.astype(np.int32), puzzle_ids.astype(np.int32))))
        z_H, z_L, logits, q_halt, q_continue = self.session.run(
            list(STEP_OUTPUTS), {**feeds, **dict(zip(CARRY, carry)), RESET: reset.astype(bool)}
        )
        return (z_H, z_L), logits, q_halt, q_continue


class TorchStep:
    """The PyTorch reference's one segment (``export.unroll.single_step``); the carry stays
    on the module's device as torch tensors, outputs come back as numpy."""

    def __init__(self, model: Any, device: Any = "cpu", steps: int | None = None):
        import torch

        from hrm_deploy.export.unroll import single_step

        self.torch, self.device = torch, torch.device(device)
        self.module = single_step(model).to(self.device)
        core = self.module.step.core
        self.steps = int(steps or core.config.halt_max_steps)
        self._state = (core.config.total_seq_len, core.config.hidden_size)
        self._dtype = next(self.module.parameters()).dtype

    def initial_carry(self, batch: int) -> Any:
        z = self.torch.zeros((batch, *self._state), dtype=self._dtype, device=self.device)
        return (z, z.clone())

    def take(self, carry: Any, rows: np.ndarray) -> Any:
        index = self.torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.device)
        return tuple(c.index_select(0, index) for c in carry)

    def __call__(self, inputs, puzzle_ids, carry, reset):
        torch = self.torch
        with torch.inference_mode():

            def to(a: np.ndarray):
                return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

            z_H, z_L, logits, q_halt, q_continue = self.module(
                to(inputs.astype(np.int32)), to(puzzle_ids.astype(np.int32)), carry[0], carry[1], to(reset.astype(bool))
            )
            return (
                (z_H, z_L),
                logits.float().cpu().numpy(),
                q_halt.float().cpu().numpy(),
                q_continue.float().cpu().numpy(),
            )


# --------------------------------------------------------------------------------- the driver
def _results(n: int, steps: int, seq_len: int, vocab: int) -> dict[str, np.ndarray]:
    return {
        "logits": np.zeros((n, seq_len, vocab), np.float32),
        "q_halt_logits": np.full((n, steps), np.nan, np.float32),
        "q_continue_logits": np.full((n, steps), np.nan, np.float32),
        "step_predictions": np.full((n, steps, seq_len), -1, np.int32),
        "steps_used": np.zeros(n, np.int32),
    }


def _record_step(
    out: dict[str, np.ndarray],
    rows: np.ndarray,
    step: np.ndarray | int,
    logits: np.ndarray,
    q_halt: np.ndarray,
    q_continue: np.ndarray,
    halt: HaltFn | None,
) -> np.ndarray:
    """Store one step's q logits and argmax for ``rows`` (puzzle indices) at ``step`` (1-based,
    one value or one per row); return which of them the rule stops now (bool [len(rows)])."""
    out["q_halt_logits"][rows, step - 1] = q_halt
    out["q_continue_logits"][rows, step - 1] = q_continue
    out["step_predictions"][rows, step - 1] = logits.argmax(-1)
    if halt is None:
        return np.zeros(len(rows), dtype=bool)
    return np.asarray(halt(step, q_halt, q_continue), dtype=bool)


def drive(
    step_fn: StepFunction,
    inputs: np.ndarray,
    puzzle_ids: np.ndarray,
    halt: HaltFn | None = None,
    *,
    compact: bool = True,
) -> dict[str, np.ndarray]:
    """Run one batch segment by segment until every row halted (or ``step_fn.steps``).

    Returns ``logits`` [B,S,V] of each row's halting step, ``steps_used`` int32 [B], and per
    step ``q_halt_logits`` / ``q_continue_logits`` [B,T] and ``step_predictions`` [B,T,S]
    (NaN / -1 after a row's halting step). ``compact`` drops halted rows from later calls
    (less work on a CPU); without it they keep being computed and masked, as on a device."""
    batch = len(inputs)
    steps = step_fn.steps
    carry = step_fn.initial_carry(batch)
    active = np.arange(batch)
    out: dict[str, np.ndarray] | None = None
    reset = np.ones(batch, dtype=bool)
    for step in range(1, steps + 1):
        rows = active if compact else np.arange(batch)
        carry, logits, q_halt, q_continue = step_fn(inputs[rows], puzzle_ids[rows], carry, reset[: len(rows)])
        reset = np.zeros(batch, dtype=bool)
        if out is None:
            out = _results(batch, steps, logits.shape[1], logits.shape[2])
        if not compact:  # the rows still running, as positions in this call
            logits, q_halt, q_continue = logits[active], q_halt[active], q_continue[active]
        stop = _record_step(out, active, step, logits, q_halt, q_continue, halt)
        if step == steps:
            stop = np.ones(len(active), dtype=bool)
        done = active[stop]
        out["logits"][done] = logits[stop]
        out["steps_used"][done] = step
        if stop.all():
            break
        if compact:
            carry = step_fn.take(carry, np.flatnonzero(~stop))
        active = active[~stop]
    assert out is not None
    return out


def run_continuous(
    step_fn: StepFunction, inputs: np.ndarray, puzzle_ids: np.ndarray, batch: int, rule: HaltRule | HaltFn | None
) -> dict[str, np.ndarray]:
    """Continuous batching over a stream: ``batch`` slots; a row that halts is replaced by the
    next puzzle through the step graph's per-row ``reset`` input, so the batch stays full
    until the stream runs dry. Returns :func:`drive`'s outputs for every puzzle, in input order."""
    n = len(inputs)
    if batch < 1:
        raise ConfigError(f"continuous batching needs a batch of at least 1, got {batch}")
    halt = rule.should_halt if isinstance(rule, HaltRule) else rule
    steps = step_fn.steps
    slots = min(batch, n)
    owner = np.arange(slots)  # puzzle index per slot
    step_of = np.ones(slots, dtype=np.int64)  # the step each slot runs next (1-based)
    reset = np.ones(slots, dtype=bool)
    carry = step_fn.initial_carry(slots)
    next_puzzle = slots
    out: dict[str, np.ndarray] | None = None
    while len(owner):
        carry, logits, q_halt, q_continue = step_fn(inputs[owner], puzzle_ids[owner], carry, reset)
        if out is None:
            out = _results(n, steps, logits.shape[1], logits.shape[2])
        stop = _record_step(out, owner, step_of, logits, q_halt, q_continue, halt)
        stop |= step_of >= steps
        done = owner[stop]
        out["logits"][done] = logits[stop]
        out["steps_used"][done] = step_of[stop]
        step_of += 1
        reset = np.zeros(len(owner), dtype=bool)
        # refill freed slots from the stream (reset=True: the step graph starts them afresh)
        freed = np.flatnonzero(stop)
        refill = freed[: max(0, min(len(freed), n - next_puzzle))]
        owner[refill] = np.arange(next_puzzle, next_puzzle + len(refill))
        step_of[refill] = 1
        reset[refill] = True
        next_puzzle += len(refill)
        keep = np.ones(len(owner), dtype=bool)
        keep[freed[len(refill) :]] = False  # the stream is empty: the batch shrinks
        if not keep.all():
            rows = np.flatnonzero(keep)
            carry, owner, step_of, reset = step_fn.take(carry, rows), owner[rows], step_of[rows], reset[rows]
    assert out is not None
    return out
