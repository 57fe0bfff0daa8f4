"""The precision table: one row per precision, the only place that lists them and their rules.

Plain data with lazy ``"module:attr"`` strings (importing it imports no torch, onnx or numpy), so
the command line, the targets, ``verify`` and the TensorRT layer check read the same rows:

- ``kind``: ``"fp32"`` (the exported graph as it is), ``"cast"`` (a float graph with float32
  islands) or ``"qdq"`` (explicit Q/DQ, calibrated on real examples);
- ``writer``: the graph writer the precision stage calls. A cast writer is
  ``(model, precision, keep_io_types) -> (model, kept_float_nodes)``; a Q/DQ writer is
  ``(job, out_path, exclude=()) -> QuantPlan`` (``job``: a :class:`~hrm_deploy.precision.job.QuantJob`,
  the FP32 graph parsed once and calibrated; a writer copies its model and never calibrates);
- ``calibration``: for Q/DQ rows, the function that measures the ranges into the job's cache once,
  before any writer runs (:func:`hrm_deploy.precision.job.calibrate_job`: one cache serves every row);
- ``min_capability``: the lowest GPU compute capability whose tensor cores run it, checked against
  every GPU target's architectures (None: every GPU); ``gpus`` names those GPUs for the error line;
- ``thresholds``: what ``verify`` asks of an artifact of this precision, and with it what every
  quantized build of this precision is held to before it publishes (the accuracy rule's
  :func:`~hrm_deploy.precision.rule.verify_view`);
- ``network_dtype``: the TensorRT network data type some layer must compute in (``"HALF"``,
  ``"FP4"``; None: nothing to look for beyond the Q/DQ layers every Q/DQ row needs);
- ``engine_dtype``: the data type TensorRT's engine inspector must show in some layer of an engine
  built at this precision (None: nothing to look for).

Adding a precision = one :class:`PrecisionEntry` row here (:func:`register` for one made at run
time) plus its graph writer; see docs/architecture.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from hrm_deploy.errors import ConfigError


@dataclass(frozen=True)
class Thresholds:
    """What ``verify`` asks of an artifact of a precision: it passes when all hold. They are judged
    cell by cell by :mod:`hrm_deploy.agreement` (its docstring says how). Agreements are fractions
    (0 to 1); errors and margins are fractions of a *scale*: the reference's largest |logit| for the
    logits, max(the reference's largest |q_halt|, 1) for q_halt. Any non-finite output fails."""

    # at least this fraction of the output cells keep the reference's answer (argmax over the vocabulary)
    min_argmax_agreement: float
    # with labels: at most this many points of exact accuracy (% of puzzles solved) lost against the reference
    max_exact_drop_points: float
    # at least this fraction of the rows keep the sign of the reference's q_halt at their last step (a loop
    # graph: its halting step too)
    min_q_halt_sign_agreement: float
    # closeness: a cell whose answer agrees is at most this far from the reference (its largest
    # |reference - candidate| logit over the scale); every cell, flipped or not, at most agreement.CELL_BAND
    # times this
    max_logits_rel_error: float = 0.02
    # the same for q_halt: at each row's last step where the signs agree; at every step within CELL_BAND times this
    max_q_halt_rel_error: float = 0.02
    # a flipped answer is excused only where the reference's top-1 minus top-2 margin there is at most this
    # (the reference hesitated between two answers; the agreement threshold counts those flips); a flip where
    # the reference was surer fails. None: max_logits_rel_error (a flip the closeness threshold itself allows)
    max_flip_margin: float | None = None
    # a q_halt sign flip (at any step both ran) is excused only where the reference's |q_halt| is at most this
    # (near zero); a clear one fails. None: max_q_halt_rel_error
    max_q_halt_flip: float | None = None


Kind = Literal["fp32", "cast", "qdq"]


@dataclass(frozen=True)
class PrecisionEntry:
    """One precision (see the module docstring for what each field means)."""

    name: str
    kind: Kind
    thresholds: Thresholds
    writer: str | None = None  # "module:function"; None only for fp32
    calibration: str | None = None  # "module:function"; Q/DQ rows
    min_capability: tuple[int, int] | None = None
    gpus: str = ""  # the GPU generations from min_capability on, for error messages
    engine_dtype: str | None = None  # normalized inspector dtype ("fp16", "fp4")
    network_dtype: str | None = None  # TensorRT network dtype name ("HALF", "BF16", "FP4")

    @property
    def calibrated(self) -> bool:
        """A Q/DQ graph: it needs calibration data."""
        return self.kind == "qdq"


_CALIBRATE = "hrm_deploy.precision.job:calibrate_job"

PRECISIONS: dict[str, PrecisionEntry] = {
    entry.name: entry
    for entry in (
        PrecisionEntry("fp32", "fp32", Thresholds(0.999, 0.5, 0.99, 0.02, 0.02)),
        PrecisionEntry(
            "fp16",
            "cast",
            Thresholds(0.995, 1.0, 0.98, 0.15, 0.15),
            "hrm_deploy.precision.fp16:convert_half",
            engine_dtype="fp16",
            network_dtype="HALF",
        ),
        PrecisionEntry(
            "bf16",
            "cast",
            Thresholds(0.99, 1.5, 0.97, 0.25, 0.25),
            "hrm_deploy.precision.fp16:convert_half",
            engine_dtype="bf16",
            network_dtype="BF16",
        ),
        PrecisionEntry(
            "int8",
            "qdq",
            Thresholds(0.98, 2.0, 0.95, 0.6, 0.6),
            "hrm_deploy.precision.int8:quantize_int8",
            _CALIBRATE,
            engine_dtype="int8",
        ),
        # INT8's bounds: FP8's answers measured as close or closer (benchmarks/results/fp8_accuracy.json)
        PrecisionEntry(
            "fp8",
            "qdq",
            Thresholds(0.98, 2.0, 0.95, 0.6, 0.6),
            "hrm_deploy.precision.fp8:quantize_fp8",
            _CALIBRATE,
            (8, 9),
            "Ada (RTX 40), Hopper or Blackwell",
            "fp8",
        ),
        # Thresholds from the bundled model's NVFP4 graph within a 1-point --accuracy-budget, run as its
        # CPU simulation (benchmarks/results/nvfp4_accuracy.json: 2.0 points on 1,000 puzzles, q_halt
        # rel. error 0.8); plain NVFP4 of that model (16 points lost, q_halt signs 85 %) fails them
        PrecisionEntry(
            "nvfp4",
            "qdq",
            Thresholds(0.98, 2.5, 0.95, 0.6, 1.0),
            "hrm_deploy.precision.nvfp4:quantize_nvfp4",
            _CALIBRATE,
            (10, 0),
            "Blackwell",
            "fp4",
            "FP4",
        ),
    )
}


def get_precision(name: str) -> PrecisionEntry:
    """The row of ``name``; one clear ConfigError naming the known ones otherwise."""
    if name not in PRECISIONS:
        raise ConfigError(f"precision {name!r} unknown; use one of {', '.join(PRECISIONS)}")
    return PRECISIONS[name]


def converted() -> tuple[str, ...]:
    """The precisions the precision stage writes (every row but the exported FP32 graph)."""
    return tuple(name for name, entry in PRECISIONS.items() if entry.kind != "fp32")


def load(ref: str) -> Callable[..., Any]:
    """The function a ``"module:function"`` field names (imported on first use)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def register(entry: PrecisionEntry) -> None:
    """Add (or replace) a row at run time: a plug-in precision, or a test's toy one."""
    PRECISIONS[entry.name] = entry
