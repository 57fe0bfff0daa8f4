"""``build-engine --target cpu``: the engine stage's entry into the cpu target's build
(:mod:`.cpu`), refusing in one line the options only TensorRT builds read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Options of build-engine that only TensorRT builds read: (EngineConfig field, flag, its default).
TENSORRT_ONLY = (
    ("min_batch", "--min-batch", None),
    ("opt_batch", "--opt-batch", None),
    ("max_batch", "--max-batch", None),
    ("workspace_mib", "--workspace", None),
    ("optimization_level", "--opt-level", None),
    ("compute_capability", "--compute-capability", None),
    ("allow_unrolled", "--allow-unrolled", False),
)


def build_for_cpu(
    onnx_path: str | Path | None,
    config: Any,
    out: str | Path | None = None,
    quiet: bool = False,
) -> Any:
    """``build-engine --target cpu``: the engine stage's options (an ``EngineConfig``) on the
    cpu target. Options it cannot honour are refused in one line; ``config.cpu_int8`` is the INT8
    recipe asked for (None: ``static``); ``config.cpu_accuracy_check`` False skips static INT8's
    comparison with FP32. Returns the ``EngineResult``."""
    from hrm_deploy.backends.ort.builder.cpu import CpuBuildConfig, build_cpu
    from hrm_deploy.engines.result import EngineResult, newest_export
    from hrm_deploy.errors import ConfigError

    if config.backend is not None:
        raise ConfigError(
            f"--backend {config.backend} does not build for --target cpu (ONNX Runtime's CPU provider); drop "
            "--backend, or drop --target cpu (--backend torch builds a PyTorch engine for this machine's CPU)"
        )
    given = [flag for field, flag, default in TENSORRT_ONLY if getattr(config, field) != default]
    if config.timing_cache not in (None, "engines/timing.cache"):
        given.append("--timing-cache")
    if given:
        raise ConfigError(
            f"{', '.join(given)}: TensorRT build option{'s' if len(given) > 1 else ''}; the cpu target runs any "
            "batch and has no builder to tune: drop them"
        )
    recipe, check_accuracy = config.cpu_int8, config.cpu_accuracy_check
    if recipe is not None and config.precision != "int8":
        raise ConfigError(f"--cpu-int8 {recipe} chooses the INT8 recipe; add --int8 (got {config.precision})")
    cpu = CpuBuildConfig(
        config.precision,
        config.threads,
        fuse=config.fuse,
        int8_recipe=recipe or "static",
        calib_data=config.calib_data,
        calib_method=config.calib_method,
        calib_samples=config.calib_samples,
        accuracy_budget=config.accuracy_budget,
        check_accuracy=check_accuracy,
    )
    built = build_cpu(onnx_path if onnx_path else newest_export(), cpu, out, quiet)
    return EngineResult(built.path, built.manifest, built.source_onnx, built.build)
