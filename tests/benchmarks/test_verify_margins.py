"""benchmarks/verify_margins.py: a smoke run (sudoku-tiny, FP32 and cpu INT8) records, per build, the
measures verify's tolerances are calibrated on, each against its bound."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import run_benchmark


@pytest.mark.slow
def test_the_tiny_run_records_each_builds_margins_against_their_bounds(tmp_path):
    out = tmp_path / "verify_margins.json"
    run_benchmark("verify_margins", "--tiny", "--out", str(out))
    rows = json.loads(out.read_text())["models"]["sudoku-tiny"]
    assert set(rows) == {"unrolled.fp32", "unrolled.cpu.int8"}
    for name, row in rows.items():
        assert row["passed"], (name, row)
        assert row["max_rel_over_closeness"] < row["cell_band"] and row["flip_margin_over_tolerance"] <= 1.0
