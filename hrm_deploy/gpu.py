"""What nvidia-smi says about this machine's first GPU (empty where there is none)."""

from __future__ import annotations

import subprocess

# report key -> nvidia-smi --query-gpu field
IDENTITY = {"gpu": "name", "driver": "driver_version", "compute_capability": "compute_cap"}
CLOCKS = {"sm_clock": "clocks.sm", "sm_clock_max": "clocks.max.sm"}  # far below max = throttling


def nvidia_smi(fields: dict[str, str]) -> dict[str, str]:
    """One ``nvidia-smi --query-gpu`` for the first GPU, as {report key: value}; {} without one."""
    query = ",".join(fields.values())
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if done.returncode != 0 or not done.stdout.strip():
        return {}
    values = [x.strip() for x in done.stdout.splitlines()[0].split(",")]
    return dict(zip(fields, values))
