"""System probes, in one place: what nvidia-smi says about the first GPU, and whether this is a Jetson.

Used by ``doctor``, the engine manifests and ``bench`` (environment capture); nothing here
imports torch, onnx or TensorRT.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

from hrm_deploy.jetpack import TEGRA_RELEASE

# report key -> nvidia-smi --query-gpu field
IDENTITY = {"gpu": "name", "driver": "driver_version", "compute_capability": "compute_cap"}
CLOCKS = {"sm_clock": "clocks.sm", "sm_clock_max": "clocks.max.sm"}  # far below max = throttling


def nvidia_smi(fields: dict[str, str]) -> dict[str, str]:
    """One ``nvidia-smi --query-gpu`` for the first GPU, as {report key: value}; {} without one."""
    query = ",".join(fields.values())
    try:
        done = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if done.returncode != 0 or not done.stdout.strip():
        return {}
    values = [x.strip() for x in done.stdout.splitlines()[0].split(",")]
    return dict(zip(fields, values))


DEVICE_TREE_MODEL = Path("/proc/device-tree/model")


def jetson_model(tree_model: Path = DEVICE_TREE_MODEL, release: Path = TEGRA_RELEASE) -> str | None:
    """The board name on a Jetson ("NVIDIA Jetson Orin Nano ..."), else None."""
    if tree_model.is_file():
        model = tree_model.read_bytes().rstrip(b"\x00").decode(errors="replace").strip()
        if "jetson" in model.lower() or "orin" in model.lower():
            return model
    if release.is_file():
        return "NVIDIA Jetson (model unknown)"
    return None


# Jetson boards whose nvidia-smi (if any) reports no compute capability: device-tree model -> sm
JETSON_CAPABILITY = {"orin": "8.7", "xavier": "7.2"}


def gpu_identity() -> dict[str, str]:
    """nvidia-smi's name, driver and compute capability of the first GPU ({} without one), with the
    compute capability filled in where nvidia-smi reports ``[N/A]`` (Jetson): from torch when it
    is already imported and sees CUDA, else cuda-python, else the Jetson board's model."""
    info = nvidia_smi(IDENTITY)
    jetson = jetson_model()
    if not info and jetson is None:
        return {}
    if _known(info.get("compute_capability")):
        return info
    capability = _capability_from_runtime()
    if capability is None and jetson is not None:
        capability = next((cc for key, cc in JETSON_CAPABILITY.items() if key in jetson.lower()), None)
    if capability is not None:
        info["compute_capability"] = capability
    else:
        info.pop("compute_capability", None)
    if jetson is not None:
        info.setdefault("gpu", jetson)
    return info


def _known(value: str | None) -> bool:
    return bool(value) and value.replace(".", "").isdigit()  # type: ignore[union-attr]


def _capability_from_runtime() -> str | None:
    torch = sys.modules.get("torch")  # never import torch just for this (the light Jetson path)
    try:
        if torch is not None and torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return f"{major}.{minor}"
        for name in ("cuda.bindings.runtime", "cuda.cudart"):
            try:
                rt = importlib.import_module(name)
            except ImportError:
                continue
            err, props = rt.cudaGetDeviceProperties(0)
            if int(err) == 0:
                return f"{int(props.major)}.{int(props.minor)}"
    except Exception:  # noqa: BLE001 - a probe: no answer rather than a crash
        return None
    return None


# Threads/processes beyond this many per core only thrash (and 100,000 threads exhaust the
# process table): a bound checked before any work starts.
THREADS_PER_CORE = 4


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask where the platform has one)."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def check_threads(value: int | None, flag: str = "--threads") -> int | None:
    """``value`` if it is None/0 (the default) or 1..THREADS_PER_CORE x cores, else a
    :class:`~hrm_deploy.errors.ConfigError` naming the bound."""
    from hrm_deploy.errors import ConfigError

    if value is None or value == 0:
        return value
    limit = THREADS_PER_CORE * usable_cores()
    if not 1 <= value <= limit:
        raise ConfigError(
            f"{flag} {value}: give 1..{limit} ({THREADS_PER_CORE} per core on this machine's "
            f"{usable_cores()} cores), or leave it out for the default"
        )
    return value


def available_memory_bytes() -> int | None:
    """Memory available to new work (``MemAvailable`` on Linux); None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def has_cuda_gpu() -> bool:
    """Whether this machine has an NVIDIA GPU that CUDA can use (nvidia-smi, a Jetson, or the CUDA runtime)."""
    return bool(nvidia_smi(IDENTITY)) or jetson_model() is not None or _capability_from_runtime() is not None


def free_disk_bytes(path: str | Path) -> int | None:
    """Free bytes on the file system that ``path`` (or its nearest existing ancestor) is on."""
    import shutil

    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def die_with_parent() -> None:
    """In a child process (a pool worker's initializer): get SIGKILL when the parent dies (Linux
    ``prctl(PR_SET_PDEATHSIG)``), so ``kill -9`` of a command never leaves its workers orphaned."""
    import os
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)
