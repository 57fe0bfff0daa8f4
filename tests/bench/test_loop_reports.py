"""A loop graph halts by the rule fixed at its export: bench's halting report and profile count the
steps it ran, not its maximum (bench wrote mean steps 8.0 beside a table saying 5.56; profile divided
a call by 8 steps)."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # exports and runs the bundled 8-step model's loop graph


@pytest.fixture(scope="module")
def loop_q(trained_small, tmp_path_factory):
    """The bundled sudoku-small exported as a loop graph halting by q, and 16 of its held-out puzzles."""
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx

    folder = tmp_path_factory.mktemp("loop_q")
    graph = export_onnx(
        trained_small.checkpoint, folder / "loopq.onnx", ExportConfig(mode="loop", halt="q", parity=False)
    )
    examples = load_examples(trained_small.data, 16, split="test")
    return graph.path, examples, folder


def test_bench_halting_report_says_the_steps_a_loop_graph_ran(loop_q, tmp_path):
    from hrm_deploy.bench.run import BenchConfig, bench

    graph, examples, folder = loop_q
    data = folder / "sixteen.npz"
    np.savez(data, inputs=examples.inputs, puzzle_identifiers=examples.puzzle_identifiers, labels=examples.labels)
    config = BenchConfig(
        data=str(data), batches=(16,), iters=1, warmup=0, halt=("q",), include_reference=False, out_dir=str(tmp_path)
    )
    report = bench([graph], config, quiet=True)
    row = report["rows"][0]
    assert row["mean_steps"] < 8.0  # the graph's own rule stops rows early
    halting = json.loads((tmp_path / "halting.json").read_text())["loopq.onnx"]
    assert halting["all_steps"]["mean_steps"] == pytest.approx(row["mean_steps"])
    assert halting["baseline"] == "its own rule (a loop graph)"
    assert halting["rules"]["q"]["run"].startswith("not available: a loop graph halts by the rule fixed")


def test_profile_divides_a_loop_call_by_the_steps_it_ran(loop_q, tmp_path):
    from hrm_deploy.backends import open_runner
    from hrm_deploy.bench.profile import ProfileConfig, profile

    graph, examples, folder = loop_q
    with open_runner(graph) as runner:
        used = runner.infer(examples.feeds(0, len(examples)))["steps_used"]
    early = int(np.argmin(used))  # a puzzle the rule stops before the last step
    assert used[early] < 8
    one = folder / "one.npz"
    np.savez(one, inputs=examples.inputs[early : early + 1], puzzle_identifiers=examples.puzzle_identifiers[:1])
    result = profile([graph], ProfileConfig(data=str(one), batch=1, calls=1, warmup=0, out_dir=str(tmp_path)))
    assert result["profiles"][0]["steps"] == int(used[early])
