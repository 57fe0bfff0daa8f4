"""benchmarks/int8_build_time.py: a smoke run of its cpu static INT8 row on the tiny bundled model
writes a row with the wall time, the stage timings and the accuracy record."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_tiny_cpu_row_is_timed_and_keeps_its_accuracy_record(tmp_path):
    out = tmp_path / "int8_build_time.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = ["--tiny", "--rows", "full", "--work", str(tmp_path / "work"), "--out", str(out)]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "int8_build_time.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert row["seconds"] > 0 and row["accuracy_check"] and row["accuracy"]["checked"]
    assert any(stage.startswith("measuring INT8 against FP32") for stage in row["timings"])
    assert report["machine"]["cpus"] >= 1 and "load_average" in report["machine"]
