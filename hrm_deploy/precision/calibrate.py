"""Calibration: the activation ranges every Q/DQ precision (INT8, FP8, NVFP4) reads, and their cache.

Which nodes get Q/DQ (:func:`plan_nodes`, TensorRT's convention: the inputs of MatMul/Gemm with a
weight; norms, softmax, residual adds, embeddings and the heads lm_head, q_head stay float), the
ranges of those inputs measured on real examples, and ONNX Runtime's calibration cache holding them
(one cache, keyed by :func:`calibration_key`, serves every Q/DQ precision and every exclusion).

Calibration runs the model through all ACT steps: the unrolled graph contains every step
(each step's MatMul is its own node, with its own activation range); a single-step graph is
driven segment by segment, its carry read from the same run that reads the ranges, so one
range covers every step; a loop graph measures its body inside the loop, one run per batch
(:func:`_with_range_outputs`). Ranges are reduced inside the graph on ONNX Runtime, on CUDA when
this onnxruntime has it (:func:`calibration_provider`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hrm_deploy.data.examples import Examples
from hrm_deploy.errors import ConfigError
from hrm_deploy.onnx_runtime import ort_session, step_once, zero_carry
from hrm_deploy.precision.rule import Outputs

if TYPE_CHECKING:
    from onnx import ModelProto

    from hrm_deploy.precision.job import QuantJob

logger = logging.getLogger(__name__)

METHODS = ("entropy", "minmax", "percentile")
DEFAULT_EXCLUDE_PATTERNS = ("*lm_head*", "*q_head*")


@dataclass(frozen=True)
class QuantConfig:
    """How to quantize. ``exclude_patterns`` are fnmatch patterns on node names."""

    # Defaults from benchmarks/results/calib_size.json and calib_overhead.json: on the bundled
    # model no method or K in 32..512 is reliably better (0.2-1.4 points off FP32, within the
    # noise of 2,000 puzzles); minmax costs a few % over plain inference (entropy/percentile
    # histograms ~200 %), and K=128 calibrates the Sudoku-size step graph in ~3 minutes on 2 cores.
    method: str = "minmax"
    samples: int | None = None  # None: by the model's cost (precision.accuracy.calibration_size: 128 or 64)
    batch: int = 32
    exclude_op_types: tuple[str, ...] = ()
    exclude_patterns: tuple[str, ...] = DEFAULT_EXCLUDE_PATTERNS
    percentile: float = 99.999

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"calibration method {self.method!r} unknown; use one of {', '.join(METHODS)}")
        if (self.samples is not None and self.samples < 1) or self.batch < 1:
            raise ConfigError("calibration samples and batch must be >= 1")


@dataclass
class QuantPlan:
    """Which nodes get Q/DQ and which were left in float, and why."""

    quantize: list[str] = field(default_factory=list)
    excluded: dict[str, str] = field(default_factory=dict)


def plan_nodes(model: ModelProto, config: QuantConfig, extra_exclude: tuple[str, ...] = ()) -> QuantPlan:
    """MatMul/Gemm nodes whose second input is a weight initializer, minus exclusions. A loop
    graph's are its body's (the segment; node names ``loop/step/...``): the weights are outer
    initializers the body reads."""
    from hrm_deploy.export.loop_body import quantizable_nodes

    initializers = {i.name for i in model.graph.initializer}
    plan = QuantPlan()
    for node in quantizable_nodes(model):
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        if len(node.input) < 2 or node.input[1] not in initializers:
            plan.excluded[node.name] = "no weight input (activation x activation)"
        elif node.op_type in config.exclude_op_types:
            plan.excluded[node.name] = f"op type {node.op_type} excluded"
        elif any(fnmatch.fnmatch(node.name, p) for p in config.exclude_patterns + extra_exclude):
            plan.excluded[node.name] = "name pattern excluded (kept in float)"
        else:
            plan.quantize.append(node.name)
    if not plan.quantize:
        raise ConfigError(
            "no MatMul/Gemm with a constant weight is left to quantize in this graph (the heads are kept "
            "float); build it in a float precision (--fp16, --bf16 or --fp32) instead"
        )
    return plan


RANGES_OUTPUT = "hrm_deploy_calib/absmax"  # minmax: one vector, max |x| of every calibrated tensor


def calibration_provider() -> str:
    """The ONNX Runtime provider calibration runs on: ``cuda`` when this onnxruntime offers it
    (the GPU build; CPU takes what CUDA does not run), ``cpu`` otherwise."""
    import onnxruntime as ort

    return "cuda" if "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"


def batch_runs(examples: Examples, batch: int, mode: str, steps: int) -> int:
    """Session runs of one calibration pass: one per batch, times ``steps`` for a single-step graph."""
    return -(-len(examples) // batch) * (steps if mode == "step" else 1)


def drive_examples(session, fetch: list[str], examples: Examples, batch: int, mode: str, steps: int) -> Iterator[list]:
    """Run the examples through ``session`` batch by batch, yielding the ``fetch`` outputs of each
    run. A single-step graph runs ``steps`` times per batch from a zero carry (``reset`` on the
    first step, as the host loop does) and reads its next carry from the same run, so ranges
    cost one pass over the data, not a float pass plus a collecting pass."""
    for start in range(0, len(examples), batch):
        feeds = examples.feeds(start, start + batch)
        if mode != "step":
            yield session.run(fetch, feeds)
            continue
        n = len(feeds["inputs"])
        carry = zero_carry(session, n)
        for step in range(steps):
            carry, _, values = step_once(session, feeds, carry, np.full((n,), step == 0), fetch)
            yield values


def _with_range_outputs(model, tensors: list[str], method: str) -> list[str]:
    """Add what calibration reads to ``model`` (in place); returns the output names to fetch.

    minmax: Abs -> ReduceMax per tensor inside the graph (ORT's threads, no activation copied
    out), the scalars concatenated into one vector output, so a run returns one small array
    instead of hundreds. entropy/percentile need the values: each tensor becomes an output.

    A loop graph (minmax only, :func:`refuse_loop_histograms`): the vector is made inside the
    body each step ([T]) and scanned out of the ``Loop`` ([steps run, T]); a ReduceMax over the
    steps outside gives the same [T] output, so one run covers every step the loop ran."""
    from onnx import TensorProto, helper

    from hrm_deploy.export.loop_body import find_loop, loop_body, scan_name

    if method != "minmax":
        present = {o.name for o in model.graph.output}
        for name in tensors:
            if name not in present:
                model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
        return list(tensors)
    loop = find_loop(model)
    graph = loop_body(model) if loop is not None else model.graph
    vector = f"{RANGES_OUTPUT}/step" if loop is not None else RANGES_OUTPUT
    flat = f"{RANGES_OUTPUT}/shape_1"
    model.graph.initializer.append(helper.make_tensor(flat, TensorProto.INT64, [1], [1]))  # a body reads it too
    peaks = []
    for i, name in enumerate(tensors):
        base = f"{RANGES_OUTPUT}/{i}"
        graph.node.extend(
            [
                helper.make_node("Abs", [name], [f"{base}/abs"], name=f"{base}/Abs"),
                helper.make_node("ReduceMax", [f"{base}/abs"], [f"{base}/max"], name=f"{base}/ReduceMax", keepdims=1),
                helper.make_node("Reshape", [f"{base}/max", flat], [f"{base}/peak"], name=f"{base}/Reshape"),
            ]
        )
        peaks.append(f"{base}/peak")
    graph.node.append(helper.make_node("Concat", peaks, [vector], name=f"{RANGES_OUTPUT}/Concat", axis=0))
    if loop is not None:  # [T] per step -> scanned [steps, T] -> max over the steps [T]
        graph.output.append(helper.make_tensor_value_info(vector, TensorProto.FLOAT, [len(tensors)]))
        loop.output.append(scan_name(vector))
        axis = f"{RANGES_OUTPUT}/axis_0"
        model.graph.initializer.append(helper.make_tensor(axis, TensorProto.INT64, [1], [0]))
        opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=18)
        over_steps = [scan_name(vector), axis] if opset >= 18 else [scan_name(vector)]  # ReduceMax-18: axes input
        reduce = helper.make_node("ReduceMax", over_steps, [RANGES_OUTPUT], name=f"{RANGES_OUTPUT}/ReduceMax_steps")
        reduce.attribute.append(helper.make_attribute("keepdims", 0))
        if opset < 18:
            reduce.attribute.append(helper.make_attribute("axes", [0]))
        model.graph.node.append(reduce)
    model.graph.output.append(helper.make_tensor_value_info(RANGES_OUTPUT, TensorProto.FLOAT, [len(tensors)]))
    return [RANGES_OUTPUT]


def refuse_loop_histograms(method: str, mode: str) -> None:
    """A loop graph calibrates with minmax only: entropy and percentile build histograms of every
    value, which would have to leave the loop as scan outputs of every step (one line naming the fix)."""
    if mode == "loop" and method != "minmax":
        raise ConfigError(
            f"--calib-method {method} of a loop graph is not offered: its histograms need every step's activations "
            "out of the loop; calibrate it with minmax (the default), or the step graph with any method"
        )


def range_session(model, source: str | Path, tensors: list[str], method: str):
    """One ONNX Runtime session over a copy of the FP32 graph ``model`` (from ``source``, whose
    puzzle table an external-table graph reads) plus the range outputs of ``tensors``, on
    :func:`calibration_provider`. Returns (session, output names to fetch per run)."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    fetch = _with_range_outputs(copy, tensors, method)
    serialized = copy.SerializeToString()
    del copy  # one copy of the weights at a time besides the session's and the caller's
    # ORT's default order runs the reductions late and keeps every calibrated activation alive
    # until then (4x the plain peak memory on the bundled unroll, GBs on a 16-step Sudoku unroll,
    # and runs up to 1.5x slower); the priority-based order runs each one as soon as it can.
    # A GPU provider that cannot load falls back to CPU: the ranges are the same, only slower.
    session = ort_session(serialized, provider=calibration_provider(), allow_fallback=True, priority_order=True)
    from hrm_deploy.puzzle_table import rows_session

    return rows_session(session, str(source)), fetch  # an external-table graph: rows gathered per batch


def calibration_key(onnx_sha: str, method: str, data_sha: str, samples: int, mode_steps: str) -> str:
    raw = f"{onnx_sha[:16]}-{method}-{data_sha[:16]}-k{samples}-{mode_steps}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)


def _progress(total: int, label: str, quiet: bool):
    """Calibration progress with ETA: a bar on a terminal, a line every few seconds in logs."""
    from hrm_deploy.progress import progress

    return progress(total, label, quiet, unit="batches")


class RangeCollector:
    """Ranges accumulated run by run: a running max |x| per tensor for minmax, ORT's
    HistogramCollector for entropy/percentile. ``add`` takes one run's fetched outputs."""

    def __init__(self, tensors: list[str], config: QuantConfig):
        from onnxruntime.quantization.calibrate import HistogramCollector

        self.tensors, self.method = tensors, config.method
        self.peaks = np.zeros(len(tensors), np.float32)
        self.collector = None
        if config.method != "minmax":
            self.collector = HistogramCollector(
                method=config.method,
                symmetric=True,
                num_bins=128,
                num_quantized_bins=128,
                percentile=config.percentile,
                scenario="same",
            )

    def add(self, values: list) -> None:
        if self.collector is None:
            np.maximum(self.peaks, values[0], out=self.peaks)  # values[0]: max |x| of this run, per tensor
        else:
            with contextlib.redirect_stdout(io.StringIO()):  # ORT's collector prints per batch
                self.collector.collect({name: [value] for name, value in zip(self.tensors, values)})

    def tensors_data(self):
        """The ranges as ORT's ``TensorsData`` (what its calibration cache holds)."""
        from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData

        if self.collector is None:
            ranges = {n: (np.array(-p, np.float32), np.array(p, np.float32)) for n, p in zip(self.tensors, self.peaks)}
            return TensorsData(CalibrationMethod.MinMax, ranges)
        method = CalibrationMethod.Entropy if self.method == "entropy" else CalibrationMethod.Percentile
        with contextlib.redirect_stdout(io.StringIO()):
            return TensorsData(method, self.collector.compute_collection_result())


def _calibrate(
    model,
    source: str | Path,
    tensors: list[str],
    examples: Examples,
    config: QuantConfig,
    mode: str,
    steps: int,
    cache_file: Path,
    on_feed: Callable[[], None] | None,
    answers: list[Outputs] | None = None,
) -> None:
    """Ranges of the MatMul activation inputs only, written as ORT's calibration cache.

    ORT's own calibrators first add ReduceMin/Max (or output) nodes for every tensor and rebuild
    a value-info map per tensor: quadratic in graph size, hours on a 16-step Sudoku unroll. Here
    only the tensors that get Q/DQ are read (:func:`range_session`), in one pass over the data
    (:func:`drive_examples`), and reduced run by run (:class:`RangeCollector`). ``answers``: where
    given, each batch's FP32 outputs (logits, q logits, a loop graph's steps) are appended to it as
    :class:`~hrm_deploy.precision.rule.Outputs` (the same runs: the holdout's reference where the
    calibration set is the holdout)."""
    from onnxruntime.quantization.calibrate import save_tensors_data

    from hrm_deploy.contract import HEADS, STEPS_USED
    from hrm_deploy.io import atomic_path

    session, fetch = range_session(model, source, tensors, config.method)
    ranges = RangeCollector(tensors, config)
    per_batch = steps if mode == "step" else 1  # runs per batch: the last one gives the answer
    heads = list(HEADS) + ([STEPS_USED] if mode == "loop" else [])
    if answers is not None:
        fetch = fetch + heads
    step_q: list[list[np.ndarray]] = [[], []]  # a step graph's q logits, step by step, of the current batch
    for run, values in enumerate(drive_examples(session, fetch, examples, config.batch, mode, steps)):
        if answers is not None:
            got = dict(zip(heads, values[-len(heads) :]))
            values = values[: -len(heads)]
            if mode == "step":
                for i, name in enumerate(HEADS[1:]):
                    step_q[i].append(np.asarray(got[name], np.float32))
            if (run + 1) % per_batch == 0:
                if mode == "step":  # [B] per step -> [B, steps]
                    got.update({name: np.stack(step_q[i], 1) for i, name in enumerate(HEADS[1:])})
                    step_q = [[], []]
                answers.append(Outputs.of(got))
        ranges.add(values)
        if on_feed:
            on_feed()
    del session
    with atomic_path(cache_file) as tmp:  # a killed calibration leaves no half-written cache
        save_tensors_data(ranges.tensors_data(), str(tmp))
    _write_seal(cache_file, len(tensors))


# The calibration cache is ORT's own JSON (``save_tensors_data``); beside it, ``<entry>.seal``
# records the schema, the entry's sha256 and its tensor count. An entry without a matching seal
# (edited, damaged, written by another version) is never used: it is measured again.
CACHE_SCHEMA = 1


def _seal_path(cache_file: Path) -> Path:
    return cache_file.with_name(cache_file.name + ".seal")


def _write_seal(cache_file: Path, tensors: int) -> None:
    from hrm_deploy.io import sha256_file, write_json

    write_json(_seal_path(cache_file), {"schema": CACHE_SCHEMA, "sha256": sha256_file(cache_file), "tensors": tensors})


def cache_problem(cache_file: Path) -> str | None:
    """Why the cache entry cannot be trusted (one phrase), or None: its seal is missing or of another
    schema, its bytes differ from the sealed sha256, or a range is not finite or not ordered."""
    import json

    from onnxruntime.quantization.calibrate import load_tensors_data

    from hrm_deploy.io import sha256_file

    try:
        seal = json.loads(_seal_path(cache_file).read_text())
    except (OSError, ValueError):
        return "has no seal (written by another version, or its seal was lost)"
    if not isinstance(seal, dict) or seal.get("schema") != CACHE_SCHEMA:
        return f"has a seal of another schema (this version writes {CACHE_SCHEMA})"
    if seal.get("sha256") != sha256_file(cache_file):
        return "does not match its seal (edited or damaged)"
    try:
        data = load_tensors_data(str(cache_file)).data
    except Exception:  # noqa: BLE001 - JSON, key and type errors of a damaged file
        return "is not readable as ONNX Runtime's calibration data"
    for name, entry in data.items():
        low, high = (np.asarray(v, np.float64) for v in entry.range_value)
        if not (np.isfinite(low).all() and np.isfinite(high).all() and (low <= high).all()):
            return f"holds a range of {name} that is not finite or not ordered"
    if len(data) != seal.get("tensors"):
        return f"holds {len(data)} ranges where its seal says {seal.get('tensors')}"
    return None


def _cache_readable(cache_file: Path) -> bool:
    return cache_file.is_file() and cache_problem(cache_file) is None


def calibrate_ranges(
    model: ModelProto,
    source: str | Path,
    examples: Examples,
    config: QuantConfig,
    cache_file: Path,
    meta: dict[str, Any],
    quiet: bool = True,
    keep_outputs: bool = False,
) -> Outputs | None:
    """The activation ranges of every weight MatMul/Gemm input of the FP32 graph ``model`` (parsed
    from ``source``) in ``cache_file``: kept when a trusted entry is there, else measured on
    ``examples`` through all ``meta['steps']`` ACT steps and written there. Every Q/DQ format
    (INT8, FP8, NVFP4) reads the same cache, and every exclusion: the ranges of all weight inputs
    are measured, not only one plan's. Returns the examples' FP32 outputs when it calibrated and
    ``keep_outputs`` asks for them (from the same runs), else None."""
    problem = cache_problem(cache_file) if cache_file.is_file() else None
    if problem:  # derived data: an untrusted entry is measured again, never used
        logger.warning("calibration cache %s %s: calibrating again", cache_file, problem)
        cache_file.unlink()
        _seal_path(cache_file).unlink(missing_ok=True)
    if cache_file.is_file():
        return None
    from hrm_deploy.export.loop_body import quantizable_nodes

    by_name = {n.name: n for n in quantizable_nodes(model)}
    all_weighted = plan_nodes(model, QuantConfig(method=config.method, exclude_patterns=()))
    tensors = sorted({by_name[n].input[0] for n in all_weighted.quantize})
    del by_name
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    mode, steps = meta["mode"], int(meta["steps"])
    total = batch_runs(examples, config.batch, mode, steps)
    answers: list[Outputs] | None = [] if keep_outputs else None
    with _progress(total, "calibrating", quiet) as on_feed:
        _calibrate(model, source, tensors, examples, config, mode, steps, cache_file, on_feed, answers)
    if not answers:
        return None
    joined = answers[0]
    for part in answers[1:]:
        joined = joined.join(part)
    return joined


def quantize_qdq(
    write: Callable[[ModelProto, QuantPlan, Path], None],
    label: str,
    job: QuantJob,
    out_path: str | Path,
    exclude: tuple[str, ...] = (),
) -> QuantPlan:
    """A Q/DQ graph whose format ``write(model, plan, cache_file)`` writes into a copy of the job's
    FP32 graph (FP8, NVFP4) from the job's cached ranges; saved to ``out_path``. ``job``: a
    :class:`~hrm_deploy.precision.job.QuantJob` (calibrated already: nothing is measured here)."""

    plan = job.plan_for(exclude)
    model = job.copy_model()  # a loop graph's body, lifted: the writer edits it as any graph
    write(model, plan, job.cache)
    job.save(model, out_path)
    logger.info("%s: %d MatMul/Gemm nodes quantized, %d kept in float", label, len(plan.quantize), len(plan.excluded))
    return plan
