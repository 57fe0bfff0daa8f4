"""Deployment targets as data: one frozen profile per target, no if-chains elsewhere."""

from __future__ import annotations

from dataclasses import dataclass

from hrm_deploy.errors import ConfigError
from hrm_deploy.precision.registry import PRECISIONS, get_precision


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
    # of that budget (estimates until measured on a board; engines/plan.py):
    os_reserve_mib: int = 0  # firmware carve-outs and the operating system
    runtime_mib: int = 0  # the CUDA context and TensorRT's libraries
    builder_optimization_level: int = 3
    dla: bool = False
    tensorrt_api: str = "any"  # the TensorRT API generation the target runs
    # compute capabilities of the target's GPUs ("12.0"); empty: the build machine's GPU
    architectures: tuple[str, ...] = ()


TARGETS: dict[str, TargetProfile] = {
    "desktop": TargetProfile(
        name="desktop",
        description="desktop RTX 50 (Blackwell, sm_120)",
        backends=("tensorrt-rtx", "tensorrt"),
        compute_capability="SM120",
        workspace_mib=4096,
        architectures=("12.0",),
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
        # the 8 GB module reports about 7,620 MiB (carve-outs), a headless L4T uses about 700 more
        os_reserve_mib=1300,
        # CUDA context with lazy kernel loading plus TensorRT's and its kernels' libraries
        runtime_mib=900,
        builder_optimization_level=3,
        dla=False,
        tensorrt_api="10.3",
        architectures=("8.7",),
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
    # No TensorRT: an ORT-optimized graph for ONNX Runtime's CPU provider (hrm_deploy.backends.ort.builder.cpu).
    "cpu": TargetProfile(
        name="cpu",
        description="ONNX Runtime CPU execution provider (no GPU)",
        backends=("ort",),
        compute_capability=None,
        workspace_mib=0,
        opt_batch=1,
        max_batch=64,
    ),
}


# The precisions and the lowest compute capability each needs come from the precision table.
ENGINE_PRECISIONS = tuple(PRECISIONS)
MIN_CAPABILITY = {name: e.min_capability for name, e in PRECISIONS.items() if e.min_capability}


def parse_capability(text: str) -> tuple[int, int]:
    """``"SM120"`` / ``"sm_89"`` / ``"8.9"`` -> (major, minor)."""
    raw = text.strip().lower().removeprefix("sm").lstrip("_")
    try:
        if "." in raw:
            major, minor = raw.split(".", 1)
            return int(major), int(minor)
        return int(raw[:-1]), int(raw[-1])
    except (ValueError, IndexError):
        raise ConfigError(f"compute capability {text!r} is not like SM89, SM120 or 8.9") from None


def target_architectures(
    target: TargetProfile, precision: str, compute_capability: str | None = None, machine: str | None = None
) -> list[str]:
    """The compute capabilities ("8.9") an engine for ``target`` is built for: the one asked for
    (``--compute-capability``), else the target's, else the build machine's GPU (``machine``);
    empty when none is known. Raises one clear ConfigError when ``precision`` needs a newer GPU."""
    if compute_capability:
        arches = ["{}.{}".format(*parse_capability(compute_capability))]
    else:
        arches = list(target.architectures) or ([machine] if machine else [])
    entry = get_precision(precision)
    need = entry.min_capability
    for arch in arches:
        if need and parse_capability(arch) < need:
            where = (
                f"--compute-capability {compute_capability} is {arch}"
                if compute_capability
                else f"target {target.name} is {arch} ({target.description})"
            )
            # the Q/DQ precisions this GPU runs: the ones that need a newer GPU first
            fits = [
                e
                for e in PRECISIONS.values()
                if e.calibrated and (e.min_capability or (0, 0)) <= parse_capability(arch)
            ]
            runs = [f"--{e.name}" for e in sorted(fits, key=lambda e: e.min_capability is None)]
            raise ConfigError(
                f"{precision} needs compute capability >= {need[0]}.{need[1]} ({entry.gpus}); "
                f"{where}: use {', '.join(runs)} or --fp16 there"
            )
    return arches


def get_target(name: str) -> TargetProfile:
    if name not in TARGETS:
        raise ConfigError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}")
    return TARGETS[name]
