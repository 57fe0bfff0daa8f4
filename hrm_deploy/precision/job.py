"""One calibrated quantization job: the FP32 graph parsed once, its activation ranges measured once,
and everything a Q/DQ writer needs in one object.

Every quantized build starts here, through one preamble, :func:`prepare_job`: the precision stage
(:mod:`hrm_deploy.precision.convert`, the TensorRT targets' INT8/FP8/NVFP4 graphs) and the cpu
target's static INT8 (:mod:`hrm_deploy.backends.ort.builder.static`) both hand it the parsed FP32
graph and a :class:`JobRequest`; it picks the calibration data (default: the checkpoint's own
dataset, from its provenance) and size, makes the :class:`QuantJob` and runs the row's calibration
(:func:`calibrate_job`) on it once. A writer, ``writer(job, out_path, exclude=()) -> QuantPlan``,
copies ``job.model``, writes its format from the ranges in ``job.cache`` and never calibrates or
parses the FP32 file again. The conductor (:mod:`hrm_deploy.precision.conductor`) reuses the same
job for every candidate.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrm_deploy.data.examples import Examples
from hrm_deploy.precision.calibrate import (
    QuantConfig,
    QuantPlan,
    _cache_readable,
    calibrate_ranges,
    calibration_key,
    calibration_provider,
    plan_nodes,
    refuse_loop_histograms,
)
from hrm_deploy.precision.rule import Outputs

if TYPE_CHECKING:
    from onnx import ModelProto

    from hrm_deploy.progress import Stages

log = logging.getLogger(__name__)


@dataclass
class QuantJob:
    """``source``: the FP32 graph's path (for messages and the puzzle table); ``model``: its parsed
    ``onnx.ModelProto`` with weights (parsed once; writers copy it, never edit it); ``meta``: its
    ``hrm_deploy.*`` metadata; ``examples`` / ``quant``: the calibration data and settings;
    ``cache``: the range cache every Q/DQ format reads; ``plan``: the nodes quantized with no extra
    exclusion; ``report``: the manifest's calibration record."""

    source: Path
    model: ModelProto
    meta: dict[str, Any]
    examples: Examples
    quant: QuantConfig
    cache: Path
    plan: QuantPlan
    report: dict[str, Any] = field(default_factory=dict)
    # the calibration set is also the accuracy check's holdout (a costly model:
    # precision.accuracy.shares_holdout); ``reference``: its FP32 outputs from the calibration pass
    share_holdout: bool = False
    reference: Outputs | None = None
    # FP32 seconds per puzzle, measured by the calibration pass on the CPU (None: the cache was
    # reused, or calibration ran on a GPU): what the build's cost estimate starts from
    fp32_seconds_per_puzzle: float | None = None

    def copy_model(self) -> ModelProto:
        """A copy of the graph a writer edits: the FP32 graph, or a loop graph's body lifted as a
        model of its own (:func:`hrm_deploy.export.loop_body.lift_body`: the segment, its weights
        as initializers); :meth:`save` writes the edited copy as the whole graph."""
        import onnx

        from hrm_deploy.export.loop_body import find_loop, lift_body

        if find_loop(self.model) is not None:
            return lift_body(self.model)
        copy = onnx.ModelProto()
        copy.CopyFrom(self.model)
        return copy

    def save(self, edited: ModelProto, out_path: str | Path) -> None:
        """Save the writer's ``edited`` copy (:meth:`copy_model`) to ``out_path``; a loop graph's
        body is seated back into its ``Loop`` first (new scales and weights in the outer graph)."""
        import onnx

        from hrm_deploy.export.loop_body import find_loop, seat_body

        if find_loop(self.model) is not None:
            edited = seat_body(self.model, edited)
        onnx.save(edited, str(out_path))

    def plan_for(self, exclude: tuple[str, ...] = ()) -> QuantPlan:
        """The plan with the nodes ``exclude`` names also kept float."""
        return plan_nodes(self.model, self.quant, exclude) if exclude else self.plan


def new_job(
    source: Path,
    model: ModelProto,
    meta: dict[str, Any],
    examples: Examples,
    quant: QuantConfig,
    cache_dir: str | Path,
    source_sha256: str,
    share_holdout: bool = False,
) -> QuantJob:
    """The job of ``model`` (the FP32 graph at ``source``, already parsed): its cache entry keyed by
    the graph's sha256, the method, the data and the sample count (``report['reused']``: a trusted
    entry is there). The caller runs the row's calibration (:func:`calibrate_job`) once, next."""
    refuse_loop_histograms(quant.method, meta["mode"])
    key = calibration_key(source_sha256, quant.method, examples.sha256, len(examples), f"{meta['mode']}{meta['steps']}")
    cache = Path(cache_dir) / f"{key}.json"
    report = {
        "key": key,
        "cache": str(cache),
        "reused": _cache_readable(cache),
        "method": quant.method,
        "samples": len(examples),
        "data": examples.source,
        "data_sha256": examples.sha256,
    }
    if share_holdout:
        report["holdout"] = "the calibration set (its FP32 answers from the calibration pass)"
    plan = plan_nodes(model, quant)
    return QuantJob(Path(source), model, meta, examples, quant, cache, plan, report, share_holdout)


def calibrate_job(job: QuantJob, quiet: bool = True) -> None:
    """Measure the ranges of every weight MatMul/Gemm input of ``job.model`` into ``job.cache``
    unless a trusted entry is there (the Q/DQ rows' ``calibration``). On the CPU the pass also
    times FP32 per puzzle, and keeps FP32's outputs where the calibration set is the holdout."""
    cpu = calibration_provider() == "cpu"  # FP32's answers and timing count only from the CPU measurements run on
    start = time.perf_counter()
    reference = calibrate_ranges(
        job.model, job.source, job.examples, job.quant, job.cache, job.meta, quiet, job.share_holdout and cpu
    )
    if job.report.get("reused"):
        return
    if cpu:
        job.fp32_seconds_per_puzzle = (time.perf_counter() - start) / max(len(job.examples), 1)
    if reference is not None:
        job.reference = reference


@dataclass(frozen=True)
class JobRequest:
    """What a quantized build's job is made from: the row ``precision`` (whose calibration runs),
    ``calib_data`` (None: the checkpoint's own dataset, from its provenance), ``quant`` (its
    ``samples`` None: by the model's cost, :func:`~hrm_deploy.precision.accuracy.calibration_size`),
    the range cache folder, and whether the build measures accuracy (``check``, with
    ``holdout_samples`` None: by the model's cost), which decides whether the calibration set is
    also the holdout."""

    precision: str
    calib_data: str | None = None
    quant: QuantConfig = QuantConfig()
    cache_dir: str = "calib"
    check: bool = True
    holdout_samples: int | None = None


def prepare_job(
    source: Path, model: ModelProto, source_sha256: str, request: JobRequest, stages: Stages, quiet: bool
) -> tuple[QuantJob, str]:
    """The one preamble of every quantized build: the calibration data (the checkpoint's own
    dataset by default, announced), its size, the job, and the row's calibration run once (skipped
    when the cache holds the ranges). Returns the job and the data it calibrated on (a dataset
    folder's ``test`` split is the holdout)."""
    from dataclasses import replace

    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.precision.accuracy import calibration_size, measures_on_calibration_set
    from hrm_deploy.precision.registry import get_precision, load

    meta = graph_metadata(model)
    samples = request.quant.samples or calibration_size(meta)
    data = request.calib_data
    if not data:
        from hrm_deploy.provenance import default_data

        # the calibration samples; the holdout of the accuracy check from the test split (all of it)
        splits: dict[str, int | None] = {"train": samples}
        if request.check:
            splits["test"] = None
        choice = default_data(source, "--calib-data", splits)
        if not quiet:
            log.info(choice.message)
        data = str(choice.path)
    examples = load_examples(data, samples)
    quant = replace(request.quant, samples=len(examples))
    share = measures_on_calibration_set(meta, request.check, request.holdout_samples)
    job = new_job(source, model, meta, examples, quant, request.cache_dir, source_sha256, share)
    row = get_precision(request.precision)
    label = (
        "reusing cached calibration"
        if job.report["reused"]
        else f"calibrating {row.name.upper()} ({quant.method}, {len(examples)} examples, all {meta['steps']} ACT steps)"
    )
    with stages.stage(label):
        load(row.calibration or "")(job, quiet)
    return job, data
