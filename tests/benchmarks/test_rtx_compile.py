"""benchmarks/rtx_compile.py, smoke-started on the tiny bundled model: each arm's change reaches the
builder the engine stage's worker runs, and its compile is timed against the FP32 pass."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import run_benchmark


@pytest.mark.slow
def test_each_arm_reaches_the_worker_builder_and_is_timed(tmp_path):
    pytest.importorskip("tensorrt_rtx", reason="pip install 'hrm-deploy[rtx]'")
    out = tmp_path / "rtx_compile.json"
    run_benchmark("rtx_compile", "--model", "sudoku-tiny", "--rounds", "1", "--arms", "default,all", "--out", str(out))
    report = json.loads(out.read_text())
    arms = report["arms"]
    assert set(arms) == {"default", "all"} and report["fp32_pass_seconds"] > 0
    assert all(arm["median_compile_seconds"] > 0 and len(arm["stage_seconds"]) == 1 for arm in arms.values())
    # the worker's own settings (the desktop target's one compute capability, its profiling) as built,
    # and each of the arm's changes seen by the builder it compiled with
    default, changed = arms["default"]["settings"], arms["all"]["settings"]
    assert default["compute_capability"] == changed["compute_capability"] == "SM120"
    assert default["profiling_verbosity"] == "DETAILED" and default["compilation_cache"] is True
    assert changed == {
        **default,
        "builder_optimization_level": 0,
        "max_num_tactics": 1,
        "max_aux_streams": 0,
        "compilation_cache": False,
        "profiling_verbosity": "LAYER_NAMES_ONLY",
    }
