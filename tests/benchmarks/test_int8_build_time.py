"""benchmarks/int8_build_time.py and int8_criteria.py, smoke-started on the tiny bundled model: the
build-time row has its ratio, absolute times, weights and accuracy record; the criteria rows have
the agreements over all cells and over solved cells beside exact accuracy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks import run_benchmark


def _run(script: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{script}.json"
    run_benchmark(script, "--tiny", "--work", str(tmp_path / "work"), "--out", str(out))
    return json.loads(out.read_text())


@pytest.mark.slow
def test_the_tiny_cpu_row_has_its_ratio_times_weights_and_accuracy_record(tmp_path):
    report = _run("int8_build_time", tmp_path)
    (row,) = report["rows"]
    assert row["row"] == "bundled-cpu" and row["seconds"] > 0 and row["accuracy"]["checked"]
    assert row["fp32_pass_seconds"] > 0 and row["fp32_pass_puzzles"] == row["accuracy"]["measured"]["holdout_puzzles"]
    # the row's seconds are rounded to 0.01 s and the pass's to 0.001 s (a tiny model's pass is well
    # under a second), the ratio from the unrounded values: within what that rounding can move it
    seconds, fp32 = row["seconds"], row["fp32_pass_seconds"]
    assert abs(row["ratio"] - seconds / fp32) <= 0.005 / fp32 + 0.0005 * seconds / fp32**2 + 0.006
    assert row["fp32_pass_streams"] >= 1 and row["cpu_seconds"] > 0 and row["fp32_pass_cpu_seconds"] > 0
    assert row["cpu_ratio"] == pytest.approx(row["cpu_seconds"] / row["fp32_pass_cpu_seconds"], rel=0.01)
    # the least ratio any scheduling could reach: the CPU seconds over every core, never above the ratio
    floor = row["ratio_if_every_core_were_busy"]
    assert 0 < floor <= row["ratio"] + 0.05 and floor * fp32 <= row["cpu_seconds"] + 0.01
    # calibrated apart from the holdout: the pass over both is longer, its ratio smaller
    assert row["fp32_pass_with_calibration_puzzles_seconds"] > fp32
    assert row["ratio_with_calibration_puzzles_in_the_pass"] < row["ratio"]
    assert row["weights"]["checkpoint"].endswith("sudoku-tiny.pt") and len(row["weights"]["sha256"]) == 64
    assert row["weights"]["trained_steps"] and row["weights"]["forward_dtype"] == "float32"
    assert row["accuracy"]["cost"]["fp32_puzzle_runs"] == row["fp32_pass_puzzles"]  # FP32 once per puzzle
    work = row["work"]  # the work counted, whatever the load: puzzle runs per held-out puzzle
    runs = work["calibration_puzzles"] + work["fp32_puzzle_runs"] + work["candidate_puzzle_runs"]
    assert work["puzzle_runs_per_holdout_puzzle"] == pytest.approx(runs / row["fp32_pass_puzzles"], abs=1e-3)
    assert sum(work["candidate_puzzle_runs_by_kind"].values()) == work["candidate_puzzle_runs"]
    assert report["machine"]["cpus"] >= 1 and "load_average" in report["machine"]


@pytest.mark.slow
def test_the_criteria_rows_relate_agreement_and_exact_accuracy(tmp_path):
    report = _run("int8_criteria", tmp_path)
    rows = report["rows"]
    assert {r["form"] for r in rows} == {"int8", "uint8"} and report["puzzles"] == 64
    for row in rows:
        assert row["flipped_cells_in_unsolved_puzzles"] <= row["flipped_cells"]
        assert row["loss_points"] == pytest.approx(100 * (row["puzzles_lost"] - row["puzzles_gained"]) / 64)
    assert "spearman_loss_vs_disagreement_all" in report["summary"]
