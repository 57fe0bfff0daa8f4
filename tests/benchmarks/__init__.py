"""Smoke runs of the scripts under benchmarks/: each started as a user would, in its own process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(script: str, *args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run ``benchmarks/<script>.py ARGS`` with this checkout importable; a failure fails the test
    with the script's last words."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / f"{script}.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done
