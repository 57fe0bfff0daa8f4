"""benchmarks/inflight_load.py: its Triton-like dynamic batcher forms batches as Triton's does, and a
smoke run on CPU measures both modes with answers equal to a lone run's."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from tests.benchmarks import run_benchmark
from tests.device_check_helpers import load_benchmark


def _load():
    return load_benchmark("inflight_load")


class EchoRunner:
    """runner.infer stand-in: logits one-hot at each row's first token, steps = that token;
    ``gate`` holds each call until released, so the test decides when a batch ends."""

    def __init__(self):
        self.gate = threading.Semaphore(0)
        self.calls = []

    def infer(self, feeds, halt=None):
        assert self.gate.acquire(timeout=10), "test gate never released"
        tokens = feeds["inputs"]
        self.calls.append(tokens[:, 0].tolist())
        logits = np.zeros((len(tokens), tokens.shape[1], 4), np.float32)
        logits[:, :, 0] = tokens[:, :1]
        return {"logits": logits, "steps_used": tokens[:, 0].astype(np.int32)}


def _wait(requests):
    assert all(r["done"].wait(10) for r in requests)


@pytest.mark.slow
def test_the_dynamic_batcher_sends_full_batches_at_once_and_partial_ones_after_the_delay():
    bench = _load()
    runner = EchoRunner()
    batcher = bench.DynamicBatcher(runner, halt=None, max_batch=3, delay_s=0.2)
    try:
        started = time.monotonic()
        first = batcher.submit(np.full(5, 1, np.int32))  # alone: goes once the oldest waited 0.2 s
        runner.gate.release()
        _wait([first])
        assert time.monotonic() - started >= 0.19 and runner.calls == [[1]]
        # while a batch runs, 5 more queue: the next batch is full (3, at once), then the last 2 after the delay
        runner.calls.clear()
        held = batcher.submit(np.full(5, 2, np.int32))
        time.sleep(0.3)  # the batcher is now inside infer, waiting on the gate
        more = [batcher.submit(np.full(5, k, np.int32)) for k in (3, 4, 5, 6, 7)]
        for _ in range(3):
            runner.gate.release()
        _wait([held, *more])
        assert runner.calls == [[2], [3, 4, 5], [6, 7]]
        assert batcher.batches[-3:] == [1, 3, 2]
        for k, request in zip((3, 4, 5, 6, 7), more):  # each request gets its own row back
            logits, steps = request["out"]
            assert steps == k and logits[0, 0] == k
    finally:
        runner.gate.release(10)
        batcher.stop()


def _smoke(tmp_path, *extra):
    out = tmp_path / "load.json"
    args = ["--smoke", "--duration", "0.3", "--puzzles", "32", "--out", str(out), *extra]
    done = run_benchmark("inflight_load", *args, cwd=tmp_path)
    return json.loads(out.read_text()), done.stdout


@pytest.mark.slow
def test_a_smoke_run_measures_both_modes_with_answers_equal_to_a_lone_run(tmp_path):
    pytest.importorskip("torch")
    report, stdout = _smoke(tmp_path)
    assert report["smoke"] and report["inflight_skipped"] is None and report["halt"] == "q"
    for mode in ("inflight", "dynamic"):
        for n in ("1", "8"):
            row = report["modes"][mode][n]
            assert row["answered"] > 0 and row["failed"] == 0 and 1 <= row["mean_steps"] <= 8
        check = report["correctness"][mode]
        assert check["checked"] >= 2 and check["mismatches"] == 0
    assert set(report["inflight_over_dynamic"]) == {"1", "8"}
    assert "| 8 | inflight |" in stdout and "not a measurement" in stdout


@pytest.mark.slow
def test_a_graph_without_a_step_function_skips_inflight_in_one_line_and_still_measures_dynamic(tmp_path):
    pytest.importorskip("onnxruntime")
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.train.presets import bundled_checkpoint

    graph = export_onnx(
        bundled_checkpoint("sudoku-tiny"),
        tmp_path / "tiny.onnx",
        ExportConfig(mode="unrolled", parity=False),
        quiet=True,
    ).path
    report, stdout = _smoke(tmp_path, "--artifact", str(graph), "--halt", "off", "--clients", "2")
    assert "unrolled graph" in report["inflight_skipped"] and set(report["modes"]) == {"dynamic"}
    assert report["modes"]["dynamic"]["2"]["answered"] > 0 and report["correctness"]["dynamic"]["mismatches"] == 0
    assert sum(line.startswith("inflight skipped:") for line in stdout.splitlines()) == 1
