"""The precision stage: FP32 ONNX -> FP16 / BF16 / INT8, FP8 or NVFP4 (Q/DQ) ONNX, with a manifest.

``make_precision_graph`` is one function from artifact to artifact. INT8, FP8 and NVFP4 calibrate on real
examples (ranges cached in ``calib/`` under a key of ONNX sha256 + method + data sha256 + K),
and with an accuracy budget keeps the most harmful layers in float until the budget holds.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hrm_deploy.errors import ArtifactError, ConfigError
from hrm_deploy.export.metadata import set_graph_precision
from hrm_deploy.io import sha256_file, staging_dir
from hrm_deploy.manifest import check_artifact, publish_artifact
from hrm_deploy.onnx_runtime import load_onnx
from hrm_deploy.precision.calibrate import QuantConfig
from hrm_deploy.precision.registry import PRECISIONS, PrecisionEntry, converted, load
from hrm_deploy.progress import Stages

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrecisionConfig:
    """What graph to make. A calibrated (quantized) graph is measured against FP32 on held-out
    puzzles by default (``accuracy_check``); ``accuracy_budget`` is the exact-accuracy points it may
    lose (None: 1 point), harmful layers staying float until it holds; ``holdout_samples`` None
    sizes the holdout by the model's cost (:func:`hrm_deploy.precision.accuracy.holdout_size`)."""

    precision: str
    calib_data: str | None = None
    quant: QuantConfig = QuantConfig()
    keep_io_types: bool = True
    accuracy_budget: float | None = None
    accuracy_check: bool = True
    holdout_samples: int | None = None
    cache_dir: str = "calib"

    def __post_init__(self) -> None:
        if self.precision not in converted():
            raise ConfigError(f"precision {self.precision!r} unknown; use one of {', '.join(converted())}")
        if self.entry.calibrated and not self.calib_data:
            raise ConfigError(
                f"{self.precision.upper()} needs calibration data: pass --calib-data DATASET_DIR or a .npz of inputs "
                "(hrm-deploy never invents scales)"
            )

    @property
    def entry(self) -> PrecisionEntry:
        """This precision's row in the precision table."""
        return PRECISIONS[self.precision]


@dataclass
class PrecisionResult:
    path: Path
    manifest: Path
    report: dict[str, Any] = field(default_factory=dict)


def _write_cast(model, config: PrecisionConfig, tmp: Path, stages: Stages) -> dict[str, Any]:
    """A float graph with float32 islands (the row's cast writer), saved to ``tmp``."""
    import onnx

    with stages.stage(f"converting to {config.precision} (float32 islands: norms, softmax, sigmoid)"):
        converted_model, kept = load(config.entry.writer or "")(model, config.precision, config.keep_io_types)
        set_graph_precision(converted_model, config.precision)
        onnx.save(converted_model, str(tmp))
    return {"float32_nodes": len(kept)}


def _write_qdq(
    src: Path, src_sha256: str, model, meta, config: PrecisionConfig, tmp: Path, stages: Stages, quiet: bool
):
    """A calibrated Q/DQ graph: one job (the parsed FP32 ``model``, its ranges measured into the
    cache once by the row's calibration, skipped when the cache holds them), the row's writer,
    then the accuracy check and its fallback on the same job."""
    import onnx

    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.precision.accuracy import measures_on_calibration_set
    from hrm_deploy.precision.job import new_job

    entry = config.entry
    examples = load_examples(str(config.calib_data), config.quant.samples)
    share = measures_on_calibration_set(meta, config.accuracy_check, config.holdout_samples)
    job = new_job(src, model, meta, examples, config.quant, config.cache_dir, src_sha256, share)
    label = (
        "reusing cached calibration"
        if job.report["reused"]
        else f"calibrating {config.precision.upper()} ({config.quant.method}, {len(examples)} examples, all {meta['steps']} ACT steps)"
    )
    with stages.stage(label):
        load(entry.calibration or "")(job, quiet)
        plan = load(entry.writer or "")(job, tmp)
    report: dict[str, Any] = {
        "calibration": job.report,
        "quantized_nodes": len(plan.quantize),
        "excluded": plan.excluded,
    }
    report["accuracy"] = _check_accuracy(job, tmp, config, stages, report)
    quantized = onnx.load(str(tmp))
    set_graph_precision(quantized, config.precision)
    onnx.save(quantized, str(tmp))
    return report


def _check_accuracy(job, tmp: Path, config: PrecisionConfig, stages, report):
    """The quantized graph against FP32 on held-out puzzles, by default, judged by the rule of
    :mod:`hrm_deploy.precision.rule` (the holdout grows while the verdict is within its noise): one
    line and the manifest's ``accuracy`` record. Outside the budget, the most harmful layers stay
    float (:func:`hrm_deploy.precision.fallback.sensitivity_fallback`) and the graph that will be
    published is measured again and judged by the same rule; outside it the build stops with one
    line (nothing is written)."""
    from dataclasses import replace

    from hrm_deploy.precision.accuracy import DEFAULT_BUDGET_POINTS, holdout_runner, job_holdout
    from hrm_deploy.precision.rule import accuracy_line, measuring, refusal

    if not config.accuracy_check:
        return {"checked": False, "why": "--no-accuracy-check: not measured against FP32"}
    budget = DEFAULT_BUDGET_POINTS if config.accuracy_budget is None else config.accuracy_budget
    runner = holdout_runner(job.source, job.meta)
    holdout, cap = job_holdout(job, str(config.calib_data), config.holdout_samples, runner)
    name = config.precision.upper()
    with stages.stage(measuring(name, holdout.size, min(cap, len(holdout.pool)))):
        first, decided = holdout.decide(tmp, budget, cap)
    quality = first
    if not first.within(budget):
        from hrm_deploy.precision.fallback import sensitivity_fallback

        budgeted = replace(config, accuracy_budget=budget)
        report["accuracy_budget"] = sensitivity_fallback(job, tmp, holdout, budgeted, stages)
        # the published graph's count (layers kept in float are no longer quantized)
        report["quantized_nodes"] = report["accuracy_budget"].get("quantized_nodes", len(job.plan.quantize))
        with stages.stage(f"measuring the {name} graph with its float layers against FP32"):
            quality, decided = holdout.decide(tmp, budget, cap)
        if not quality.within(budget):
            raise ConfigError(refusal(name, first, quality, len(report["accuracy_budget"]["kept_float"]), budget))
    log.info(accuracy_line(name, quality, budget, quality is not first))
    exact_key = "exact_pct"
    return {
        "checked": True,
        "budget_points": budget,
        **quality.as_dict(exact_key),
        "decided": decided,
        **({"before_fallback": first.as_dict(exact_key)} if quality is not first else {}),
    }


def make_precision_graph(
    onnx_path: str | os.PathLike,
    config: PrecisionConfig,
    out: str | os.PathLike | None = None,
    quiet: bool = False,
    model: Any = None,
) -> PrecisionResult:
    """Write ``<name>.<precision>.onnx`` (beside the FP32 graph unless ``out``) and its manifest.
    ``model``: the graph at ``onnx_path`` already parsed with its weights (the build stage's one
    parse); None parses it here, once."""
    from hrm_deploy.export.metadata import graph_metadata

    src = Path(onnx_path)
    if not src.is_file():
        raise ArtifactError(f"{src} does not exist; export one first with `hrm-deploy export`")
    # the FP32 graph is what its manifest says (then its recorded sha256 is the file's)
    src_sha256 = (check_artifact(src) or {}).get("sha256") or sha256_file(src)
    if model is None:
        model = load_onnx(src, weights=True)  # the one parse of the FP32 graph on this path
    meta = graph_metadata(model)
    if meta.get("precision", "fp32") != "fp32":
        raise ConfigError(f"{src} is already {meta['precision']}; convert the FP32 export instead")
    stem = src.name[: -len(".onnx")] if src.name.endswith(".onnx") else src.stem
    target = Path(out) if out else src.with_name(f"{stem}.{config.precision}.onnx")
    stages = Stages(quiet)
    with staging_dir(target.parent if str(target.parent) else Path("."), "stage") as staging:
        tmp = staging / target.name
        if config.entry.calibrated:
            report = _write_qdq(src, src_sha256, model, meta, config, tmp, stages, quiet)
        else:
            report = _write_cast(model, config, tmp, stages)
        # artifact + manifest as one unit (manifest renamed last, sha256 of the staged bytes)
        manifest = publish_artifact(
            tmp,
            target,
            stage=f"precision-{config.precision}",
            parent=src,
            parent_sha256=src_sha256,
            config={**asdict(config), "quant": asdict(config.quant)},
            precision=config.precision,
            mode=meta["mode"],
            steps=meta["steps"],
            report=report,
            timings=stages.timings,
        )
    return PrecisionResult(target, manifest, report)
