"""The engine stage: an ONNX export (or a checkpoint) -> an engine + manifest, for a target.

``build_engine`` is one function from artifact to artifact. It validates the options
(:class:`EngineConfig`) and hands them to the builder of the chosen backend, looked up in the
backend table (:func:`hrm_deploy.backends.builder`): TensorRT / TensorRT-RTX
(:mod:`hrm_deploy.backends.tensorrt.builder`), the ``cpu`` target's ONNX Runtime graphs
(:mod:`hrm_deploy.backends.ort.builder`) or PyTorch AOTInductor (:mod:`hrm_deploy.backends.torch.builder`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hrm_deploy.backends import builder
from hrm_deploy.engines.result import EngineResult, newest_export
from hrm_deploy.engines.targets import ENGINE_PRECISIONS, get_target
from hrm_deploy.errors import ConfigError
from hrm_deploy.precision.registry import PRECISIONS

__all__ = ["ENGINE_PRECISIONS", "EngineConfig", "EngineResult", "build_engine", "newest_export"]

MAX_BATCH = 1 << 16  # TensorRT profiles: int32 dims, and far beyond any GPU's memory for this model
MAX_WORKSPACE_MIB = 1 << 20  # 1 TiB


@dataclass(frozen=True)
class EngineConfig:
    """What to build; None fields take the target profile's default."""

    precision: str = "fp16"
    target: str = "desktop"
    backend: str | None = None
    min_batch: int | None = None
    opt_batch: int | None = None
    max_batch: int | None = None
    workspace_mib: int | None = None
    optimization_level: int | None = None
    compute_capability: str | None = None
    calib_data: str | None = None
    calib_method: str = "minmax"  # see QuantConfig: measured defaults
    calib_samples: int = 128
    accuracy_budget: float | None = None
    timing_cache: str | None = "engines/timing.cache"  # base name; the file is keyed by GPU + TensorRT version
    threads: int | None = None  # cpu target: ONNX Runtime intra-op threads (None: one per core)
    fuse: bool = True  # cpu target: attention and RMSNorm into ORT's fused CPU kernels
    cpu_int8: str | None = None  # cpu target: INT8 recipe (backends/ort/builder/int8.py; None: static)
    cpu_accuracy_check: bool = True  # cpu target: static INT8 compared with FP32 on held-out data
    allow_unrolled: bool = False  # TensorRT: build an unrolled graph whose estimated cost is over budget (backends/tensorrt/builder/cost.py)
    device: str = "auto"  # torch backend: compile for "cuda", "cpu" or "auto" (cuda when torch sees a GPU)

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r} unknown; use one of {', '.join(PRECISIONS)}")
        for name, flag in (("min_batch", "--min-batch"), ("opt_batch", "--opt-batch"), ("max_batch", "--max-batch")):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= MAX_BATCH:
                raise ConfigError(f"{flag} must be between 1 and {MAX_BATCH}, got {value}")
        if self.workspace_mib is not None and not 16 <= self.workspace_mib <= MAX_WORKSPACE_MIB:
            raise ConfigError(f"--workspace must be between 16 and {MAX_WORKSPACE_MIB} MiB, got {self.workspace_mib}")
        if self.optimization_level is not None and not 0 <= self.optimization_level <= 5:
            raise ConfigError(
                f"--opt-level must be between 0 and 5 (TensorRT's builder levels), got {self.optimization_level}"
            )
        if not 1 <= self.calib_samples <= 1_000_000:
            raise ConfigError(f"--calib-samples must be between 1 and 1000000, got {self.calib_samples}")
        if self.accuracy_budget is not None and not 0.0 <= self.accuracy_budget <= 100.0:
            raise ConfigError(f"--accuracy-budget is in exact-accuracy points, 0 to 100, got {self.accuracy_budget}")
        if self.target != "cpu" and (not self.fuse or self.cpu_int8 is not None or not self.cpu_accuracy_check):
            given = (
                "--no-fuse"
                if not self.fuse
                else f"--cpu-int8 {self.cpu_int8}"
                if self.cpu_int8
                else "--no-accuracy-check"
            )
            raise ConfigError(f"{given} is an option of --target cpu; the {self.target} target does not take it")
        need_gpu = PRECISIONS[self.precision].min_capability
        if self.target == "cpu" and need_gpu:
            need = "{}.{}".format(*need_gpu)
            raise ConfigError(
                f"{self.precision} engines need a GPU of compute capability >= {need} (TensorRT); for the cpu "
                f"target use --int8 or --fp32 ({self.precision.upper()} accuracy is measured on CPU by "
                f"benchmarks/{self.precision}_accuracy.py)"
            )
        if self.cpu_int8 is not None and self.precision != "int8":
            raise ConfigError(f"--cpu-int8 {self.cpu_int8} chooses the INT8 recipe; add --int8 (got {self.precision})")


def build_engine(
    onnx_path: str | os.PathLike | None, config: EngineConfig, out: str | os.PathLike | None = None, quiet: bool = False
) -> EngineResult:
    """Build an engine for ``config.target`` from ``onnx_path`` (default: newest export).
    ``config.backend == "torch"``: a PyTorch (AOTInductor) engine for this machine instead;
    ``onnx_path`` may then also be a checkpoint. The ``cpu`` target makes an ORT-optimized ONNX."""
    target = get_target(config.target)
    # the cpu target has one builder (ONNX Runtime), which refuses a --backend itself in one line
    backend = target.backends[0] if target.name == "cpu" else (config.backend or target.backends[0])
    return builder(backend)(onnx_path, config, out, quiet)
