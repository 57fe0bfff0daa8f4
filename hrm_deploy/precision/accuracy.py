"""Accuracy of an ONNX graph on held-out examples (the precision stage's check).

It runs the graph through the base's ONNX Runtime session and step loop
(:mod:`hrm_deploy.onnx_runtime`), not through a backend's runner: the precision room imports no
backend."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hrm_deploy.data.examples import Examples
from hrm_deploy.metrics import accuracy

# The default accuracy check of every quantized build (INT8, FP8, NVFP4; the cpu target's own too):
# the rule and how a holdout decides it are in hrm_deploy.precision.rule
from hrm_deploy.precision.rule import DEFAULT_BUDGET_POINTS, MIN_AGREEMENT_PCT, Holdout  # noqa: E402,F401 - the rule's

# The holdout: as many puzzles as HOLDOUT_FLOPS of FP32 work, between MIN_HOLDOUT and
# HOLDOUT_SAMPLES. On the bundled model 128 puzzles measured minmax static INT8 0.8 points
# *above* FP32 where 1,000 measured it 1.5 below: one puzzle is 0.1 point of 1,000, 0.8 of 128.
# 1e13 FLOPs is ~1 minute of FP32 on 2 cores: the bundled model gets 1,000 puzzles, a
# Sudoku-size (hidden 512, 16 ACT steps) model the minimum, 64 (the manifest says how many).
HOLDOUT_SAMPLES = 1000
HOLDOUT_FLOPS = 1e13
MIN_HOLDOUT = 64


def _affordable(meta: dict) -> int:
    """Puzzles that :data:`HOLDOUT_FLOPS` of FP32 work run through all the graph's ACT steps."""
    from hrm_deploy.model.families import config_from_dict

    config = config_from_dict(meta["config"])
    d, inter = config.hidden_size, config.intermediate_size
    per_token_block = 2 * (4 * d * d + 3 * d * inter)  # qkv + o, gate_up + down: multiply-adds x 2
    flops = per_token_block * config.total_seq_len * config.blocks_per_step * int(meta["steps"])
    return int(HOLDOUT_FLOPS // max(flops, 1))


def holdout_size(meta: dict, most: int = HOLDOUT_SAMPLES) -> int:
    """Held-out puzzles for a model: as many as :data:`HOLDOUT_FLOPS` of FP32 work allow (at
    least :data:`MIN_HOLDOUT`, at most ``most``). Fixed by the model's shape, not by a clock, so
    one build gives the same engine on an idle or a busy machine."""
    return max(MIN_HOLDOUT, min(most, _affordable(meta)))


# Calibration examples when none are asked for: QuantConfig's measured default (128; on the bundled
# model no K in 32..512 was reliably better, benchmarks/results/calib_size.json), or, for a model so
# costly that even the minimum holdout is over HOLDOUT_FLOPS (a Sudoku-size model: 46 puzzles' worth),
# MIN_HOLDOUT examples that are also the holdout: the calibration pass's FP32 answers are then the
# check's reference, so FP32 runs once per build, not twice (with minmax ranges the holdout sees no
# clipping the calibration did not see; the manifest says the holdout is the calibration set).
CALIB_SAMPLES = 128


def shares_holdout(meta: dict) -> bool:
    """Whether a build of this graph that asks for no holdout size measures on its calibration set."""
    return _affordable(meta) < MIN_HOLDOUT


def measures_on_calibration_set(meta: dict, checked: bool, holdout_samples: int | None) -> bool:
    """Whether a quantized build's job shares its calibration set as the holdout: a checked build
    of a costly graph (:func:`shares_holdout`) that asks for no holdout size."""
    return checked and holdout_samples is None and shares_holdout(meta)


def calibration_size(meta: dict) -> int:
    """Calibration examples of a build that asks for none (see :data:`CALIB_SAMPLES`)."""
    return MIN_HOLDOUT if shares_holdout(meta) else CALIB_SAMPLES


def job_holdout(job, data: str, samples: int | None, run) -> tuple[Holdout, int]:
    """The holdout a quantized build of ``job`` is measured on, and how far it may grow: the
    calibration set itself (FP32's answers from the calibration pass where it ran, ``job.reference``)
    when the job shares it, then the dataset's ``test`` split to grow into; else ``samples`` (None:
    :func:`holdout_size`) puzzles of the test split (:func:`holdout_examples`). ``run`` computes
    a graph's logits (the FP32 graph's where not known)."""
    from hrm_deploy.precision.rule import growth_cap

    if not job.share_holdout:
        count = samples or holdout_size(job.meta)
        cap = growth_cap(count)
        return Holdout(job.source, holdout_examples(data, job.examples, cap), run, count), cap
    from hrm_deploy.errors import DataError

    count = len(job.examples)
    cap = growth_cap(count)
    pool = job.examples
    try:  # puzzles to grow into while the verdict is within the noise: the test split
        more = holdout_examples(data, job.examples, cap - count)
    except DataError:  # a .npz calibration used entirely: the calibration set alone
        more = None
    if more is not None and len(more) and more.labels is not None and job.examples.labels is not None:
        pool = Examples(
            np.concatenate([job.examples.inputs, more.inputs]),
            np.concatenate([job.examples.puzzle_identifiers, more.puzzle_identifiers]),
            np.concatenate([job.examples.labels, more.labels]),
            job.examples.source,
            "",
        )
    return Holdout(job.source, pool, run, count, job.reference), min(cap, len(pool))


def holdout_examples(data: str, calibration: Examples, count: int) -> Examples:
    """``count`` held-out puzzles: a dataset folder's ``test`` split; from a ``.npz`` (one set), the
    examples calibration did not use (one line when none is left)."""
    from pathlib import Path

    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.errors import DataError

    if not Path(data).is_file():
        return load_examples(data, count, split="test")
    everything = load_examples(data, None)
    seen = {row.tobytes() for row in calibration.inputs}
    keep = np.array([i for i, row in enumerate(everything.inputs) if row.tobytes() not in seen][:count], np.int64)
    if not len(keep):
        raise DataError(
            f"{data}: calibration used every example, none is left to measure the quantized graph on; pass a "
            "dataset folder (its test split is the holdout), a larger .npz, a smaller --calib-samples, or "
            "--no-accuracy-check"
        )
    labels = everything.labels[keep] if everything.labels is not None else None
    return Examples(everything.inputs[keep], everything.puzzle_identifiers[keep], labels, str(data), "")


def quantized_logits(path: str | Path, examples: Examples) -> np.ndarray:
    """Final logits of a graph of any precision on ONNX Runtime CPU (an NVFP4 graph through its CPU
    simulation): how the precision stage's holdout runs candidate graphs."""
    from hrm_deploy.precision.nvfp4 import cpu_runnable

    with cpu_runnable(str(path)) as runnable:
        return onnx_logits(runnable, examples)


def holdout_runner(fp32: Path, meta: dict):
    """The precision stage's ``run`` for a :class:`~hrm_deploy.precision.rule.Holdout`: the FP32
    graph ``fp32`` with the metadata the stage parsed (no second parse), any other graph by
    :func:`quantized_logits`."""

    def run(path: Path, examples: Examples) -> np.ndarray:
        if Path(path) == Path(fp32):
            return onnx_logits(str(path), examples, meta=meta)
        return quantized_logits(path, examples)

    return run


def onnx_accuracy(path: str, examples: Examples, batch: int = 64) -> dict[str, float]:
    """Accuracy of an ONNX graph (either mode) on ONNX Runtime CPU (see :func:`onnx_logits`)."""
    return accuracy(onnx_logits(path, examples, batch), examples.labels)


def onnx_logits(path: str, examples: Examples, batch: int = 64, meta: dict | None = None) -> np.ndarray:
    """Final logits of an ONNX graph (either mode) on ONNX Runtime CPU: an unrolled graph in one call
    per batch, a single-step graph driven through all its ACT steps. ``meta``: the graph's
    ``hrm_deploy.*`` metadata where the caller has it (else the graph is parsed for it)."""
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.manifest import check_artifact
    from hrm_deploy.onnx_runtime import load_onnx, ort_session, run_stepwise
    from hrm_deploy.puzzle_table import rows_session

    manifest = check_artifact(path)  # a graph whose manifest describes other bytes is refused
    meta = meta or graph_metadata(load_onnx(path))
    # export --puzzle-emb external: the session gathers the rows of the ids it is fed
    session = rows_session(ort_session(path, provider="cpu"), path, manifest)
    logits = []
    for start in range(0, len(examples), batch):
        feeds = {k: np.asarray(v, np.int32) for k, v in examples.feeds(start, start + batch).items()}
        if meta["mode"] == "step":
            logits.append(run_stepwise(session, feeds, None, int(meta["steps"]))["logits"])
        else:
            logits.append(session.run(["logits"], feeds)[0])
    return np.concatenate(logits).astype(np.float32)
