"""The host-side step driver and continuous batching over any step function (one ACT segment per
call, :class:`hrm_deploy.contract.StepFunction`): each backend brings its own (the ONNX Runtime step
graph in :mod:`hrm_deploy.backends.ort.step`, the PyTorch reference's single segment in
:mod:`hrm_deploy.backends.reference`); this module imports none of them.

Shapes: B rows, S = seq_len, V = vocab, T = steps. Carries are opaque to the driver (a tuple
of batch-first arrays or tensors); a :class:`StepFunction` knows how to make and slice them."""

from __future__ import annotations

import numpy as np

from hrm_deploy.contract import HaltFn, StepFunction
from hrm_deploy.errors import ConfigError
from hrm_deploy.halting.rules import HaltRule


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
