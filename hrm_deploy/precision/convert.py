"""The precision stage: FP32 ONNX -> FP16 / BF16 / INT8, FP8 or NVFP4 (Q/DQ) ONNX, with a manifest.

``make_precision_graph`` is one function from artifact to artifact. INT8, FP8 and NVFP4 calibrate on real
examples (ranges cached in ``calib/`` under a key of ONNX sha256 + method + data sha256 + K),
and with an accuracy budget keeps the most harmful layers in float until the budget holds.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hrm_deploy.errors import ArtifactError, ConfigError, require
from hrm_deploy.io import sha256_file, staging_dir
from hrm_deploy.manifest import check_artifact, publish_artifact
from hrm_deploy.precision.int8 import QuantConfig, QuantPlan, _cache_readable, calibration_key, quantize_int8
from hrm_deploy.progress import Stages

PRECISIONS = ("fp16", "bf16", "int8", "fp8", "nvfp4")
QDQ_PRECISIONS = ("int8", "fp8", "nvfp4")  # calibrated Q/DQ graphs (one range cache serves all)


@dataclass(frozen=True)
class PrecisionConfig:
    """What graph to make. ``accuracy_budget`` is in points of exact accuracy (1.0 = 1 %)."""

    precision: str
    calib_data: str | None = None
    quant: QuantConfig = QuantConfig()
    keep_io_types: bool = True
    accuracy_budget: float | None = None
    holdout_samples: int = 256
    cache_dir: str = "calib"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r} unknown; use one of {', '.join(PRECISIONS)}")
        if self.precision in QDQ_PRECISIONS and not self.calib_data:
            raise ConfigError(
                f"{self.precision.upper()} needs calibration data: pass --calib-data DATASET_DIR or a .npz of inputs "
                "(hrm-deploy never invents scales)"
            )


@dataclass
class PrecisionResult:
    path: Path
    manifest: Path
    report: dict[str, Any] = field(default_factory=dict)


def _load(path: Path):
    onnx = require("onnx", "onnx", "Precision conversion")
    try:
        return onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001 - protobuf raises several unrelated types
        raise ArtifactError(f"{path} is not a readable ONNX file ({type(exc).__name__}); re-export it") from None


def _set_precision_metadata(model, precision: str) -> None:
    for prop in model.metadata_props:
        if prop.key == "hrm_deploy.precision":
            prop.value = precision


def _quantizer(precision: str):
    """The Q/DQ graph writer of ``precision`` (same signature for INT8, FP8 and NVFP4)."""
    if precision == "fp8":
        from hrm_deploy.precision.fp8 import quantize_fp8

        return quantize_fp8
    if precision == "nvfp4":
        from hrm_deploy.precision.nvfp4 import quantize_nvfp4

        return quantize_nvfp4
    return quantize_int8


def _holdout_accuracy(path: str, examples, meta) -> float:
    """Exact accuracy in points on ONNX Runtime CPU (an NVFP4 graph through its CPU simulation)."""
    from hrm_deploy.precision.accuracy import onnx_accuracy
    from hrm_deploy.precision.nvfp4 import cpu_runnable

    with cpu_runnable(path) as runnable:
        return 100.0 * onnx_accuracy(runnable, examples)["exact_accuracy"]


def _sensitivity_fallback(
    fp32: Path,
    out_tmp: Path,
    examples,
    holdout,
    config: PrecisionConfig,
    cache: Path,
    meta,
    plan: QuantPlan,
    stages: Stages,
) -> dict[str, Any]:
    """Keep whole layers (all unrolled copies of one weight) in float, most harmful first,
    until the Q/DQ graph loses at most the budget on the holdout. Sensitivity of a layer = accuracy lost
    when only that layer is quantized (ranges come from the cache: no recalibration)."""
    import onnx

    from hrm_deploy.precision.int8 import keep_sensitive_float

    budget = float(config.accuracy_budget or 0.0)
    base = _holdout_accuracy(str(fp32), holdout, meta)
    current = _holdout_accuracy(str(out_tmp), holdout, meta)
    measured_key = f"{config.precision}_exact"
    quantize = _quantizer(config.precision)
    report: dict[str, Any] = {"fp32_exact": base, measured_key: current, "budget_points": budget, "kept_float": []}
    if base - current <= budget:
        return report
    model = onnx.load(str(fp32))
    by_weight: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.name in plan.quantize:
            by_weight.setdefault(node.input[1], []).append(node.name)
    del model
    probe = out_tmp.with_name(out_tmp.name + ".probe.onnx")

    def measure(exclude: tuple[str, ...]) -> float:
        quantize(
            str(fp32), str(probe), examples, config.quant, cache, meta["mode"], meta["steps"], extra_exclude=exclude
        )
        return _holdout_accuracy(str(probe), holdout, meta)

    with stages.stage(f"sensitivity of {len(by_weight)} layers"):
        chosen = keep_sensitive_float(
            by_weight,
            measure,
            severity=lambda exact: base - exact,
            within=lambda exact: base - exact <= budget,
            refuse=lambda exact: (
                f"{config.precision.upper()} cannot meet the {budget} point budget even with one layer quantized; "
                "use --fp16 or a larger --accuracy-budget"
            ),
            whole=current,
        )
    exclude = tuple(n for w in chosen.kept_float for n in by_weight[w])
    final = quantize(
        str(fp32), str(out_tmp), examples, config.quant, cache, meta["mode"], meta["steps"], extra_exclude=exclude
    )
    probe.unlink(missing_ok=True)
    report.update({measured_key: chosen.measured}, kept_float=chosen.kept_float, layer_loss_points=chosen.sensitivity)
    report["quantized_nodes"] = len(final.quantize)  # in the published graph (the layers kept float are out)
    return report


def make_precision_graph(
    onnx_path: str | os.PathLike, config: PrecisionConfig, out: str | os.PathLike | None = None, quiet: bool = False
) -> PrecisionResult:
    """Write ``<name>.<precision>.onnx`` (beside the FP32 graph unless ``out``) and its manifest."""
    from hrm_deploy.export.metadata import graph_metadata

    src = Path(onnx_path)
    if not src.is_file():
        raise ArtifactError(f"{src} does not exist; export one first with `hrm-deploy export`")
    # the FP32 graph is what its manifest says (then its recorded sha256 is the file's)
    src_sha256 = (check_artifact(src) or {}).get("sha256") or sha256_file(src)
    model = _load(src)
    meta = graph_metadata(model)
    if meta.get("precision", "fp32") != "fp32":
        raise ConfigError(f"{src} is already {meta['precision']}; convert the FP32 export instead")
    stem = src.name[: -len(".onnx")] if src.name.endswith(".onnx") else src.stem
    target = Path(out) if out else src.with_name(f"{stem}.{config.precision}.onnx")
    stages = Stages(quiet)
    report: dict[str, Any] = {}
    onnx = require("onnx", "onnx", "Precision conversion")
    with staging_dir(target.parent if str(target.parent) else Path("."), "stage") as staging:
        tmp = staging / target.name
        if config.precision in ("fp16", "bf16"):
            from hrm_deploy.precision.fp16 import convert_half

            with stages.stage(f"converting to {config.precision} (float32 islands: norms, softmax, sigmoid)"):
                converted, kept = convert_half(model, config.precision, config.keep_io_types)
                _set_precision_metadata(converted, config.precision)
                onnx.save(converted, str(tmp))
            report["float32_nodes"] = len(kept)
        else:
            from hrm_deploy.data.examples import load_examples

            examples = load_examples(str(config.calib_data), config.quant.samples)
            key = calibration_key(
                src_sha256, config.quant.method, examples.sha256, len(examples), f"{meta['mode']}{meta['steps']}"
            )
            cache = Path(config.cache_dir) / f"{key}.json"
            cached = cache.is_file() and _cache_readable(cache)
            label = (
                "reusing cached calibration"
                if cached
                else f"calibrating {config.precision.upper()} ({config.quant.method}, {len(examples)} examples, all {meta['steps']} ACT steps)"
            )
            with stages.stage(label):
                plan = _quantizer(config.precision)(
                    str(src), str(tmp), examples, config.quant, cache, meta["mode"], meta["steps"], quiet=quiet
                )
            report.update(
                calibration={
                    "key": key,
                    "cache": str(cache),
                    "reused": cached,
                    "method": config.quant.method,
                    "samples": len(examples),
                    "data": examples.source,
                    "data_sha256": examples.sha256,
                },
                quantized_nodes=len(plan.quantize),
                excluded=plan.excluded,
            )
            if config.accuracy_budget is not None:
                holdout = load_examples(str(config.calib_data), config.holdout_samples, split="test")
                report["accuracy_budget"] = _sensitivity_fallback(
                    src, tmp, examples, holdout, config, cache, meta, plan, stages
                )
                # the published graph's count (layers kept in float are no longer quantized)
                report["quantized_nodes"] = report["accuracy_budget"].get("quantized_nodes", len(plan.quantize))
            quantized = onnx.load(str(tmp))
            _set_precision_metadata(quantized, config.precision)
            onnx.save(quantized, str(tmp))
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
