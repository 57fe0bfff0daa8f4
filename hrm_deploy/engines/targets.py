"""Deployment targets as data: one frozen profile per target, no if-chains elsewhere."""

from __future__ import annotations

from dataclasses import dataclass

from hrm_deploy.errors import ConfigError


@dataclass(frozen=True)
class TargetProfile:
    """Defaults a build takes from its target (each overridable on the command line)."""

    name: str
    description: str
    backends: tuple[str, ...]  # allowed, first = default
    compute_capability: str | None  # RTX AOT target ("SM120"); None: the build machine's GPU
    workspace_mib: int
    min_batch: int = 1
    opt_batch: int = 8
    max_batch: int = 64
    default_mode: str = "unrolled"  # which export an engine is built from by default
    memory_budget_mib: int | None = None  # shared CPU+GPU memory the build must fit in
    builder_optimization_level: int = 3
    dla: bool = False
    tensorrt_api: str = "any"  # the TensorRT API generation the target runs


TARGETS: dict[str, TargetProfile] = {
    "desktop": TargetProfile(
        name="desktop",
        description="desktop RTX 50 (Blackwell, sm_120)",
        backends=("tensorrt-rtx", "tensorrt"),
        compute_capability="SM120",
        workspace_mib=4096,
    ),
    "jetson-orin-8gb": TargetProfile(
        name="jetson-orin-8gb",
        description="Jetson Orin Nano / NX 8 GB (sm_87, JetPack 6, TensorRT 10.3)",
        backends=("tensorrt",),
        compute_capability=None,
        workspace_mib=1024,
        opt_batch=1,
        max_batch=16,
        default_mode="step",
        memory_budget_mib=8192,
        builder_optimization_level=3,
        dla=False,
        tensorrt_api="10.3",
    ),
    "datacenter": TargetProfile(
        name="datacenter",
        description="datacenter GPU (generic TensorRT 10/11)",
        backends=("tensorrt",),
        compute_capability=None,
        workspace_mib=8192,
        opt_batch=64,
        max_batch=256,
    ),
    # No TensorRT: an ORT-optimized graph for ONNX Runtime's CPU provider (hrm_deploy.engines.cpu).
    "cpu": TargetProfile(
        name="cpu",
        description="ONNX Runtime CPU execution provider (no GPU)",
        backends=("onnxruntime",),
        compute_capability=None,
        workspace_mib=0,
        opt_batch=1,
        max_batch=64,
    ),
}


def get_target(name: str) -> TargetProfile:
    if name not in TARGETS:
        raise ConfigError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}")
    return TARGETS[name]
