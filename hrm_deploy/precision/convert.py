"""The precision stage: FP32 ONNX -> FP16 / BF16 / INT8, FP8 or NVFP4 (Q/DQ) ONNX, with a manifest.

``make_precision_graph`` is one function from artifact to artifact. INT8, FP8 and NVFP4 calibrate on real
examples (ranges cached in ``calib/`` under a key of ONNX sha256 + method + data sha256 + K) through
the one job preamble, and the conductor holds them to the accuracy rule, keeping the most harmful
layers float until it holds, and names the graph to publish: the one it measured last.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrm_deploy.errors import ArtifactError, ConfigError, InternalError
from hrm_deploy.export.metadata import set_graph_precision
from hrm_deploy.io import sha256_file, staging_dir
from hrm_deploy.manifest import check_artifact, publish_artifact
from hrm_deploy.onnx_runtime import load_onnx
from hrm_deploy.precision.calibrate import QuantConfig, QuantPlan
from hrm_deploy.precision.job import JobRequest
from hrm_deploy.precision.registry import PRECISIONS, PrecisionEntry, converted, load
from hrm_deploy.progress import Stages

if TYPE_CHECKING:
    from onnx import ModelProto

    from hrm_deploy.precision.job import QuantJob

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrecisionConfig:
    """What graph to make. A calibrated (quantized) graph calibrates on ``calib_data`` (None: the
    checkpoint's own dataset, from its provenance) and is measured against FP32 on held-out puzzles
    by default (``accuracy_check``); ``accuracy_budget`` is the exact-accuracy points it may lose
    (None: 1 point), harmful layers staying float until the rule holds; ``holdout_samples`` None
    sizes the holdout by the model's cost (:func:`hrm_deploy.precision.accuracy.holdout_size`);
    ``quant.samples`` None sizes the calibration set by it too."""

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

    @property
    def entry(self) -> PrecisionEntry:
        """This precision's row in the precision table."""
        return PRECISIONS[self.precision]

    def job_request(self) -> JobRequest:
        """The quantization job this config asks for (the one preamble of every quantized build)."""
        return JobRequest(
            self.precision, self.calib_data, self.quant, self.cache_dir, self.accuracy_check, self.holdout_samples
        )


@dataclass
class PrecisionResult:
    path: Path
    manifest: Path
    report: dict[str, Any] = field(default_factory=dict)


def _write_cast(model: ModelProto, config: PrecisionConfig, tmp: Path, stages: Stages) -> dict[str, Any]:
    """A float graph with float32 islands (the row's cast writer), saved to ``tmp``."""
    import onnx

    with stages.stage(f"converting to {config.precision} (float32 islands: norms, softmax, sigmoid)"):
        converted_model, kept = load(config.entry.writer or "")(model, config.precision, config.keep_io_types)
        set_graph_precision(converted_model, config.precision)
        onnx.save(converted_model, str(tmp))
    return {"float32_nodes": len(kept)}


@dataclass
class RowCandidates:
    """The precision stage's candidates (:class:`~hrm_deploy.precision.conductor.Candidates`): the
    row's Q/DQ writer from the job writes the all-quantized graph once; each candidate keeping nodes
    float is that graph with them put back on float (:func:`~hrm_deploy.precision.fallback.keep_float`,
    a graph edit, not another quantization); the precision set in the graph's metadata, as published."""

    job: QuantJob
    precision: str
    plans: dict[tuple[str, ...], QuantPlan] = field(default_factory=dict)
    _qdq: ModelProto | None = None

    @property
    def name(self) -> str:
        return self.precision.upper()

    def write(self, exclude: tuple[str, ...], out: Path) -> None:
        import onnx

        from hrm_deploy.precision.fallback import keep_float

        if not exclude:
            self.plans[()] = load(PRECISIONS[self.precision].writer or "")(self.job, out, ())
            graph = onnx.load(str(out))
            set_graph_precision(graph, self.precision)
            self._qdq = graph
        else:
            everything = self.plans.get(())
            if everything is None:
                raise InternalError("a fallback candidate is written before the all-quantized one")
            graph = keep_float(self.qdq(), self.job.model, exclude)
            kept = set(exclude)
            self.plans[exclude] = QuantPlan(
                [n for n in everything.quantize if n not in kept],
                {**everything.excluded, **{n: "kept in float by the accuracy fallback" for n in exclude}},
            )
        onnx.save(graph, str(out))

    def qdq(self) -> ModelProto:
        if self._qdq is None:
            raise InternalError("the all-quantized candidate is ranked before it was written")
        return self._qdq


def _write_qdq(
    src: Path, src_sha256: str, model: ModelProto, config: PrecisionConfig, work: Path, stages: Stages, quiet: bool
) -> tuple[Path, dict[str, Any]]:
    """A calibrated Q/DQ graph: the one job preamble (:func:`~hrm_deploy.precision.job.prepare_job`),
    then the conductor (:func:`~hrm_deploy.precision.conductor.conduct`): the accuracy rule, its
    fallback and the graph to publish, the one measured last. Returns its path and the report."""
    from hrm_deploy.precision.accuracy import GraphRunner
    from hrm_deploy.precision.conductor import Check, conduct
    from hrm_deploy.precision.job import prepare_job
    from hrm_deploy.precision.rule import Rule

    job, data = prepare_job(src, model, src_sha256, config.job_request(), stages, quiet)
    candidates = RowCandidates(job, config.precision)
    with GraphRunner(job.meta, table_of=src, fp4=config.precision == "nvfp4") as runner:
        rule = Rule.of(config.precision, config.accuracy_budget)
        check = Check(rule, data, runner, config.holdout_samples, runner.streams) if config.accuracy_check else None
        verdict = conduct(job, candidates, check, work, stages)
    plan = candidates.plans[verdict.kept]
    report: dict[str, Any] = {
        "calibration": job.report,
        "quantized_nodes": len(plan.quantize),
        "excluded": plan.excluded,
        "accuracy": verdict.record,
    }
    return verdict.path, report


def make_precision_graph(
    onnx_path: str | os.PathLike,
    config: PrecisionConfig,
    out: str | os.PathLike | None = None,
    quiet: bool = False,
    model: ModelProto | None = None,
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
            tmp, report = _write_qdq(src, src_sha256, model, config, staging, stages, quiet)
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
