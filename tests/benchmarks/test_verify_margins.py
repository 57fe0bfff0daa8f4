"""benchmarks/verify_margins.py: a smoke run (sudoku-tiny, FP32 and cpu INT8) records, per build, the
measures verify's tolerances are calibrated on, each against its bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_tiny_run_records_each_builds_margins_against_their_bounds(tmp_path):
    out = tmp_path / "verify_margins.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "verify_margins.py"), "--tiny", "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["models"]["sudoku-tiny"]
    assert set(rows) == {"unrolled.fp32", "unrolled.cpu.int8"}
    for name, row in rows.items():
        assert row["passed"], (name, row)
        assert row["max_rel_over_closeness"] < row["cell_band"] and row["flip_margin_over_tolerance"] <= 1.0
