"""benchmarks/ort_streams.py, smoke-started on the tiny bundled model: the three arms timed, their
outputs compared bit for bit."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import run_benchmark


@pytest.mark.slow
def test_the_three_arms_are_timed_and_give_the_same_bits(tmp_path):
    out = tmp_path / "ort_streams.json"
    run_benchmark("ort_streams", "--model", "sudoku-tiny", "--passes", "1", "--out", str(out))
    report = json.loads(out.read_text())
    assert set(report["median_seconds"]) == {"one_session", "one_thread", "streams"}
    assert all(v > 0 for v in report["median_seconds"].values()) and report["puzzles"] > 0
    assert report["outputs_bit_identical"] is True and report["streams"] >= 1
    assert set(report["by_batch_ms_per_puzzle"]) == {"8", "64", "256"}
