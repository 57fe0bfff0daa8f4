"""One calibrated quantization job: the FP32 graph parsed once, its activation ranges measured once,
and everything a Q/DQ writer needs in one object.

The precision stage (:mod:`hrm_deploy.precision.convert`) and the cpu target's static INT8
(:mod:`hrm_deploy.backends.ort.builder.static`) both make a :class:`QuantJob` with
:func:`new_job` and run the row's calibration (:func:`calibrate_job`) on it once, and only there, and
hand it to the row's writer, ``writer(job, out_path, exclude=()) -> QuantPlan``, which copies
``job.model``, writes its format from the ranges in ``job.cache`` and never calibrates or parses
the FP32 file again. The accuracy fallback reuses the same job for every probe.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hrm_deploy.data.examples import Examples
from hrm_deploy.precision.calibrate import (
    QuantConfig,
    QuantPlan,
    _cache_readable,
    calibrate_ranges,
    calibration_key,
    plan_nodes,
    refuse_loop_histograms,
)

log = logging.getLogger(__name__)


@dataclass
class QuantJob:
    """``source``: the FP32 graph's path (for messages and the puzzle table); ``model``: its parsed
    ``onnx.ModelProto`` with weights (parsed once; writers copy it, never edit it); ``meta``: its
    ``hrm_deploy.*`` metadata; ``examples`` / ``quant``: the calibration data and settings;
    ``cache``: the range cache every Q/DQ format reads; ``plan``: the nodes quantized with no extra
    exclusion; ``report``: the manifest's calibration record."""

    source: Path
    model: Any
    meta: dict[str, Any]
    examples: Examples
    quant: QuantConfig
    cache: Path
    plan: QuantPlan
    report: dict[str, Any] = field(default_factory=dict)
    # the calibration set is also the accuracy check's holdout (a costly model:
    # precision.accuracy.shares_holdout); ``reference``: its FP32 logits from the calibration pass
    share_holdout: bool = False
    reference: Any = None

    def copy_model(self) -> Any:
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

    def save(self, edited: Any, out_path: str | Path) -> None:
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
    model: Any,
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
    unless a trusted entry is there (the Q/DQ rows' ``calibration``)."""
    reference = calibrate_ranges(
        job.model, job.source, job.examples, job.quant, job.cache, job.meta, quiet, job.share_holdout
    )
    if reference is not None:
        job.reference = reference
