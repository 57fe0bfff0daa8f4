"""The graphs' contract: the step and unrolled graphs' I/O names and shapes, the carry, and the
halting function type. Export writes graphs with these names; the runners, the device loop, the
ONNX Runtime host loop, calibration and the Triton driver read them from here (the driver through
its model-config parameters, written from these tuples).

Shapes: B batch (dynamic), S sequence length, T = puzzle prefix + S (the carry's length),
D hidden size, V vocabulary, N ACT steps.

Unrolled graph (all N steps in one call)::

    inputs [B, S] int, puzzle_identifiers [B] int
      -> logits [B, S, V] (last step), q_halt_logits [B, N], q_continue_logits [B, N]
         (+ step_predictions [B, N, S] int when exported with per-step answers)

Step graph (one ACT segment, the carry in and out)::

    inputs [B, S], puzzle_identifiers [B], z_H [B, T, D], z_L [B, T, D], reset [B] bool
      -> z_H_out, z_L_out [B, T, D], logits [B, S, V], q_halt_logits [B], q_continue_logits [B]

``reset`` rows start from the model's initial carry (upstream's ``reset_carry``); the carry
outputs are fed back as the next step's carry inputs.

Loop graph (the ACT loop inside one call, halting rule fixed at export)::

    inputs [B, S] int, puzzle_identifiers [B] int
      -> logits [B, S, V] (each row's halting step), q_halt_logits [B, N], q_continue_logits [B, N]
         (NaN after a row's halting step), steps_used [B] int32

A graph exported with ``--puzzle-emb external`` takes ``puzzle_emb_rows`` float32 [B, E] (E the
puzzle-embedding width: the table rows of the batch's puzzles) in place of ``puzzle_identifiers``;
callers still give identifiers, and :mod:`hrm_deploy.puzzle_table` gathers the rows on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np

FEEDS = ("inputs", "puzzle_identifiers")  # what a caller gives: token ids [B, S], puzzle ids [B]
CARRY = ("z_H", "z_L")  # [B, T, D] each: the recurrent state between ACT steps
CARRY_OUT = tuple(f"{name}_out" for name in CARRY)  # the step graph's next carry, same shapes
RESET = "reset"  # [B] bool
Q_LOGITS = ("q_halt_logits", "q_continue_logits")  # step: [B]; unrolled: [B, N]
HEADS = ("logits", *Q_LOGITS)  # logits [B, S, V]
STEP_INPUTS = (*FEEDS, *CARRY, RESET)
STEP_OUTPUTS = (*CARRY_OUT, *HEADS)
UNROLLED_INPUTS = FEEDS
UNROLLED_OUTPUTS = HEADS
STEPS_USED = "steps_used"  # loop graph output: int32 [B], the ACT steps each row ran
LOOP_OUTPUTS = (*HEADS, STEPS_USED)
STEP_PREDICTIONS = "step_predictions"  # optional unrolled output: argmax per step [B, N, S] int32
# export --puzzle-emb external: the graph takes the batch's puzzle-embedding table rows, float32
# [B, puzzle_emb_ndim], in place of puzzle_identifiers; the host gathers them (hrm_deploy.puzzle_table)
PUZZLE_ROWS = "puzzle_emb_rows"

# A halt rule as every step driver calls it: (step, q_halt [B], q_continue [B]) -> bool [B], "these
# rows are done" (e.g. hrm_deploy.halting.HaltRule.should_halt). ``step`` is 1-based: one int, or
# int [B] (one per row) where continuous batching runs rows at different steps.
HaltFn = Callable[[int | np.ndarray, np.ndarray, np.ndarray], np.ndarray]


class TensorIO(NamedTuple):
    """One graph input or output: ``shape`` has ``"batch"`` for the dynamic batch dimension."""

    name: str
    is_input: bool
    dtype: str  # numpy dtype name: "int32", "float32", "bool"
    shape: tuple[int | str, ...]


def graph_io(
    mode: str,
    seq_len: int,
    carry_len: int,
    hidden: int,
    vocab: int,
    steps: int,
    step_predictions: bool = False,
    puzzle_rows: int = 0,
) -> tuple[TensorIO, ...]:
    """The I/O of a ``"step"``, ``"unrolled"`` or ``"loop"`` graph as exported (inputs first, in call order):
    token and puzzle ids int32, the carry and heads float32, ``reset`` bool. Engines may narrow
    float dtypes (bf16 / fp16 engines) but never rename or reshape. ``puzzle_rows`` > 0: an
    external-table graph, :data:`PUZZLE_ROWS` float32 [B, puzzle_rows] in place of the ids."""
    b = "batch"
    puzzle = TensorIO(FEEDS[1], True, "int32", (b,))
    if puzzle_rows > 0:
        puzzle = TensorIO(PUZZLE_ROWS, True, "float32", (b, puzzle_rows))
    feeds = (TensorIO(FEEDS[0], True, "int32", (b, seq_len)), puzzle)
    logits = TensorIO(HEADS[0], False, "float32", (b, seq_len, vocab))
    if mode == "step":
        carry = (b, carry_len, hidden)
        return (
            *feeds,
            *(TensorIO(name, True, "float32", carry) for name in CARRY),
            TensorIO(RESET, True, "bool", (b,)),
            *(TensorIO(name, False, "float32", carry) for name in CARRY_OUT),
            logits,
            *(TensorIO(name, False, "float32", (b,)) for name in Q_LOGITS),
        )
    if mode == "loop":
        return (
            *feeds,
            logits,
            *(TensorIO(name, False, "float32", (b, steps)) for name in Q_LOGITS),
            TensorIO(STEPS_USED, False, "int32", (b,)),
        )
    if mode != "unrolled":
        raise ValueError(f"graph mode {mode!r}: expected 'step', 'unrolled' or 'loop'")
    per_step = tuple(TensorIO(name, False, "float32", (b, steps)) for name in Q_LOGITS)
    predictions = (TensorIO(STEP_PREDICTIONS, False, "int32", (b, steps, seq_len)),) if step_predictions else ()
    return (*feeds, logits, *per_step, *predictions)


class StepFunction(Protocol):
    """The step contract: one ACT segment per call, what the halting scheduler drives. Each backend
    that runs a step brings one (ONNX Runtime: ``backends.ort.step.OrtStep``; the PyTorch reference:
    ``backends.reference.TorchStep``). ``steps`` is the model's ``halt_max_steps``."""

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
