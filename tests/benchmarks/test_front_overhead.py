"""benchmarks/front_overhead.py: a smoke run measures both paths and writes its result."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import run_benchmark


@pytest.mark.slow
def test_a_smoke_run_measures_direct_and_through_the_front(tmp_path):
    out = tmp_path / "front.json"
    run_benchmark("front_overhead", "--requests", "20", "--out", str(out), timeout=120)
    result = json.loads(out.read_text())
    assert result["requests"] == 20 and result["front_us"]["p50"] > 0 and result["direct_us"]["p50"] > 0
