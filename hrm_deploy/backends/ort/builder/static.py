"""Static INT8 of the ``cpu`` target: activation scales fixed at build time, within an accuracy budget.

* Ranges come from the project's calibration (:func:`hrm_deploy.precision.int8.quantize_int8`:
  same data default from the checkpoint's provenance, same methods, same cache in ``calib/``),
  written as Q/DQ on the inputs of the weight MatMul/Gemm nodes with **uint8 activations**
  (zero point 128) and **int8 per-channel weights**; ONNX Runtime's optimizer turns each
  ``DequantizeLinear -> MatMul`` into an integer GEMM (``MatMulIntegerToFloat``). The scale of
  every activation is a constant, so each puzzle's answer is the same whatever its batch-mates.
* The built graph is measured against the FP32 export on held-out puzzles (the calibration
  dataset's ``test`` split): exact accuracy and argmax agreement. Outside the budget (default:
  at most 1 point of exact accuracy lost and >= 98 % argmax agreement), the most sensitive
  weights stay FP32: ranked by measured sensitivity on a quarter of the holdout, the fewest found
  by bisection on all of it (:mod:`hrm_deploy.backends.ort.builder.fallback`); when no mix
  meets the budget the build is refused with the numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hrm_deploy.data.examples import Examples

# the budget and the holdout's size are every quantized build's (the precision stage's accuracy check)
from hrm_deploy.precision.accuracy import (  # noqa: F401 - re-exported for the cpu builder and its tests
    DEFAULT_BUDGET_POINTS,
    HOLDOUT_SAMPLES,
    MIN_AGREEMENT_PCT,
    MIN_HOLDOUT,
    holdout_size,
)
from hrm_deploy.precision.rule import Holdout, Quality, refusal

if TYPE_CHECKING:
    from hrm_deploy.precision.job import QuantJob

log = logging.getLogger(__name__)

HOLDOUT_BATCH = 32


def _logits(
    path: str | Path,
    examples: Examples,
    threads: int | None,
    table_of: Path | None = None,
    meta: dict[str, Any] | None = None,
) -> np.ndarray:
    from hrm_deploy.backends.ort.runner import OrtRunner
    from hrm_deploy.runtime.infer import predict

    runner = OrtRunner(path, threads=threads, table_of=table_of, meta=meta)  # a staged graph: the FP32 export's table
    runner.activate()
    try:
        return predict(runner, examples, batch=HOLDOUT_BATCH)
    finally:
        runner.close()


def ort_run(fp32: Path, threads: int | None, meta: dict[str, Any] | None = None) -> Callable[..., np.ndarray]:
    """A holdout's ``run`` on this backend's runner: a staged candidate reads the FP32 export's
    puzzle table; the FP32 graph's ``meta``, where given, spares its second parse."""
    fp32 = Path(fp32)

    def run(path: Path, examples: Examples) -> np.ndarray:
        if Path(path) == fp32:
            return _logits(path, examples, threads, None, meta or None)
        return _logits(path, examples, threads, fp32)

    return run


def calibration(src: Path, model: Any, src_sha256: str, meta: dict[str, Any], config: Any, quiet: bool) -> QuantJob:
    """The quantization job of the parsed FP32 graph ``model``: calibration examples
    (``config.calib_data``, default: the checkpoint's own dataset from its provenance, announced)
    and the cache entry of their ranges, keyed as the precision stage keys them (calibrated once,
    by :func:`quantize_static`'s first call)."""
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.precision.accuracy import calibration_size, measures_on_calibration_set
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.job import new_job

    samples = config.calib_samples or calibration_size(meta)
    data = config.calib_data
    if not data:
        from hrm_deploy.provenance import default_data

        # the holdout is the test split: all of it when the build measures INT8 (its size is the holdout's)
        splits: dict[str, int | None] = {"train": samples}
        if config.check_accuracy:
            splits["test"] = None
        choice = default_data(src, "--calib-data", splits)
        if not quiet:
            log.info(choice.message)
        data = str(choice.path)
    examples = load_examples(str(data), samples)
    quant = QuantConfig(method=config.calib_method, samples=samples, exclude_patterns=config.exclude_patterns)
    share = measures_on_calibration_set(meta, config.check_accuracy, config.holdout_samples)
    return new_job(src, model, meta, examples, quant, config.cache_dir, src_sha256, share)


def quantize_static(job: QuantJob, out: Path, config: Any, exclude: tuple[str, ...] = ()) -> list[str]:
    """Q/DQ graph of the job's FP32 graph at ``out`` (its ranges measured first if the cache lacks
    them: once per build), uint8 or int8 activations by ``config.activations`` (U8S8 or S8S8
    integer GEMMs; ``auto`` not yet resolved: uint8), int8 weights per channel (``exclude``: node
    names kept FP32); returns the quantized nodes."""
    from hrm_deploy.precision.int8 import quantize_int8
    from hrm_deploy.precision.job import calibrate_job

    calibrate_job(job, quiet=True)
    activations = "int8" if getattr(config, "activations", "uint8") == "int8" else "uint8"
    return quantize_int8(job, out, exclude, activations=activations).quantize


def holdout(src: Path, calib: QuantJob, meta: dict[str, Any], config: Any) -> tuple[Holdout, int]:
    """The held-out puzzles and how far they may grow, as every quantized build's
    (:func:`hrm_deploy.precision.accuracy.job_holdout`): ``config.holdout_samples`` (None: by the
    model's cost) of a dataset folder's ``test`` split, or from a ``.npz`` (one set) the examples
    calibration did not use; for a costly model the calibration set itself, FP32's answers from its
    pass. Run on this backend's runner."""
    from hrm_deploy.precision.accuracy import job_holdout

    return job_holdout(calib, calib.examples.source, config.holdout_samples, ort_run(src, config.threads, meta))


def fit_budget(
    job: QuantJob,
    config: Any,
    whole: Quality,
    check: Holdout,
    probe: Path,
) -> tuple[list[dict[str, Any]], tuple[str, ...], list[dict[str, Any]], dict[str, Any]]:
    """The weights to keep FP32 so that INT8 is within ``config`` 's budget: each weight ranked by
    its own output error in one pass (:func:`hrm_deploy.precision.sensitivity.local_errors`), then
    the fewest most sensitive ones found by bisection on the whole holdout
    (:func:`hrm_deploy.precision.fallback.bisect_fallback`, bounded in probes and time; one
    quantization of the job, every probe a graph edit). Returns the kept weights, their node names,
    every weight's signal and how the search ran (probes, limits); refuses when no mix fits."""
    import onnx

    from hrm_deploy.backends.ort.builder.fallback import float_probe
    from hrm_deploy.precision.fallback import bisect_fallback, weight_groups

    budget = config.budget
    by_weight = weight_groups(job.model, job.plan.quantize)
    weights = {t.name: t for t in job.model.graph.initializer if t.name in by_weight}
    quantize_static(job, probe, config)  # once: every probe is this graph, edited
    qdq = onnx.load(str(probe))
    from hrm_deploy.precision.sensitivity import RANK_PUZZLES, local_errors

    signal = local_errors(qdq, job.model, by_weight, check.examples, job.source, job.meta)

    def measure_on(holdout: Holdout, kept: list[str]) -> Quality:
        exclude = {n for w in kept for n in by_weight[w]}
        onnx.save(float_probe(qdq, weights, exclude), str(probe))
        quality = holdout.measure(probe)
        log.info("INT8 with %d nodes kept FP32: %s", len(exclude), quality.describe())
        return quality

    def refuse(q: Quality | None) -> str:
        return refusal("static INT8", whole, q or whole, len(by_weight) - 1, budget)

    try:
        chosen = bisect_fallback(
            list(by_weight),
            signal.__getitem__,
            lambda kept: measure_on(check, kept),
            lambda q: q.within(budget),
            refuse,
        )
    finally:
        probe.unlink(missing_ok=True)
    log.info("fallback: %d whole-holdout probes (%s)", chosen.probes, chosen.limits)
    exclude = tuple(n for w in chosen.kept_float for n in by_weight[w])
    # named by weight and by its first node (the readable one); sensitivity: the weight's own relative output error
    kept = [{"weight": w, "node": by_weight[w][0], "nodes": len(by_weight[w])} for w in chosen.kept_float]
    ranked = sorted(chosen.sensitivity.items(), key=lambda kv: -kv[1])
    sensitivity_rows = [{"weight": w, "node": by_weight[w][0], "sensitivity": round(s, 6)} for w, s in ranked]
    search = {
        "method": "rank by each weight's own output error (one pass), bisect on the whole holdout",
        "probes": chosen.probes,
        "ranking_puzzles": min(RANK_PUZZLES, len(check.examples)),
        "bisection_probes": chosen.probes,
        "limits": chosen.limits,
    }
    return kept, exclude, sensitivity_rows, search


def sink_quantize(model: Any) -> int:
    """Undo ONNX Runtime's QDQ propagation where it splits a pattern the CPU fusions read: its
    optimizer hoists the attention output's ``QuantizeLinear`` above the ``Transpose -> Reshape``
    that merges the heads (``MatMul -> Q -> Transpose -> Reshape -> integer GEMM``); this moves
    it back below them (``MatMul -> Transpose -> Reshape -> Q``). A per-tensor Q commutes with
    both exactly (same bytes out), so the rewrite changes no value. Edits ``model`` in place;
    returns how many were moved."""
    graph = model.graph
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    initializers = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}

    def only(name: str, op_type: str) -> Any:
        users = consumers.get(name, [])
        if len(users) == 1 and users[0].op_type == op_type and name not in outputs:
            return users[0]
        return None

    moved = 0
    for quant in [n for n in graph.node if n.op_type == "QuantizeLinear"]:
        scale = initializers.get(quant.input[1])
        if scale is None or len(scale.dims) > 0 and max(scale.dims) > 1:
            continue  # per-channel: does not commute with a transpose
        transpose = only(quant.output[0], "Transpose")
        reshape = only(transpose.output[0], "Reshape") if transpose is not None else None
        if reshape is None:
            continue
        quantized = reshape.output[0]
        transpose.input[0] = quant.input[0]
        transpose.output[0] = f"{quantized}/float_transposed"
        reshape.input[0] = transpose.output[0]
        reshape.output[0] = f"{quantized}/float"
        quant.input[0] = reshape.output[0]
        quant.output[0] = quantized
        graph.node.remove(quant)  # after the reshape, keeping the order topological
        graph.node.insert(list(graph.node).index(reshape) + 1, quant)
        moved += 1
    return moved
