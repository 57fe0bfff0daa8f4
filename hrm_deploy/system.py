"""System probes, in one place: what nvidia-smi says about the first GPU, and whether this is a Jetson.

Used by ``doctor``, the engine manifests and ``bench`` (environment capture); nothing here
imports torch, onnx or TensorRT.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

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


TEGRA_RELEASE = Path("/etc/nv_tegra_release")
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
