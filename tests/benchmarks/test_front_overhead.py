"""benchmarks/front_overhead.py: a smoke run measures both paths and writes its result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_smoke_run_measures_direct_and_through_the_front(tmp_path):
    out = tmp_path / "front.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "front_overhead.py"), "--requests", "20", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["requests"] == 20 and result["front_us"]["p50"] > 0 and result["direct_us"]["p50"] > 0
