"""``export --mode loop``: the ACT loop inside one ONNX graph, answers equal to the host loop's."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hrm_deploy.errors import ConfigError, ExportError
from hrm_deploy.export.onnx_export import ExportConfig
from hrm_deploy.train.presets import bundled_checkpoint

pytestmark = pytest.mark.slow  # each export traces and checks a model (seconds)


def _feeds(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    # the bundled models' own kind of puzzle (10-30 blanks): trained weights, so rules really halt
    split = generate_sudoku(SudokuSpec(train=0, test=n, blanks=(10, 30), augment=0, seed=seed))["test"]
    return {"inputs": split.inputs.astype(np.int32), "puzzle_identifiers": np.zeros(n, np.int32)}


def _run(path: Path, feeds: dict[str, np.ndarray], halt=None) -> dict[str, np.ndarray]:
    from hrm_deploy.backends import open_runner

    with open_runner(path) as runner:
        return runner.infer(feeds, halt=halt)


def test_halting_off_equals_the_unrolled_graph_bit_for_bit(bundled_export) -> None:
    feeds = _feeds(24)
    loop = _run(bundled_export("sudoku-small", "loop"), feeds)
    unrolled = _run(bundled_export("sudoku-small", "unrolled"), feeds)
    for name in ("logits", "q_halt_logits", "q_continue_logits"):
        assert np.array_equal(loop[name], unrolled[name]), name
    assert (loop["steps_used"] == 8).all()


@pytest.mark.parametrize(
    ("model", "rule"), [("sudoku-small", "q"), ("sudoku-small", "threshold:0.7"), ("trm-sudoku-small", "q")]
)
def test_each_rule_equals_the_host_loop_over_the_step_graph(bundled_export, model: str, rule: str) -> None:
    from hrm_deploy.halting import resolve_rule

    feeds = _feeds(32)
    step = bundled_export(model, "step")
    loop_path = bundled_export(model, "loop", rule)
    loop = _run(loop_path, feeds)
    host = _run(step, feeds, halt=resolve_rule(rule, str(step)).should_halt)
    assert np.array_equal(loop["steps_used"], host["steps_used"])
    assert loop["steps_used"].min() < loop["steps_used"].max() or rule == "q"  # the rule really halts rows early
    assert np.array_equal(loop["logits"].argmax(-1), host["logits"].argmax(-1))
    np.testing.assert_allclose(loop["logits"], host["logits"], atol=1e-5)
    np.testing.assert_allclose(loop["q_halt_logits"], host["q_halt_logits"], atol=1e-5)  # NaN where NaN
    # a row's answer does not depend on its batch-mates: each row alone gives the same
    for row in (0, 7, 31):
        alone = _run(loop_path, {k: v[row : row + 1] for k, v in feeds.items()})
        assert alone["steps_used"][0] == loop["steps_used"][row]
        assert np.array_equal(alone["logits"][0].argmax(-1), loop["logits"][row].argmax(-1))
    from hrm_deploy.manifest import read_manifest

    manifest = read_manifest(loop_path)
    assert manifest["mode"] == "loop" and manifest["halt"]["rule"] == rule
    assert manifest["parity"]["loop"]["passed"]


def test_a_rule_that_needs_host_state_is_refused_with_the_alternative(bundled_export) -> None:
    with pytest.raises(ConfigError, match="--mode step"):
        bundled_export("sudoku-small", "loop", "budget:1")
    with pytest.raises(ConfigError, match="only a loop graph"):
        ExportConfig(mode="step", halt="q")


def test_a_loop_graph_refuses_a_run_time_rule_in_one_line(bundled_export) -> None:
    from hrm_deploy.halting import HaltRule

    path = bundled_export("sudoku-small", "loop", "q")
    with pytest.raises(ConfigError, match="halts by its own rule \\(q"):
        _run(path, _feeds(2), halt=HaltRule.parse("q").should_halt)


def test_control_flow_is_allowed_only_as_the_one_top_level_loop(bundled_export) -> None:
    import onnx

    from hrm_deploy.export.graph import check_structure
    from hrm_deploy.manifest import read_manifest

    path = bundled_export("sudoku-small", "loop")
    model = onnx.load(str(path))
    io = {
        side: {n: (getattr(onnx.TensorProto, t), tuple(d)) for n, (t, d) in read_manifest(path)["io"][side].items()}
        for side in ("inputs", "outputs")
    }
    check_structure(model, io, loop=True)
    with pytest.raises(ExportError, match="control-flow"):
        check_structure(model, io)  # the unrolled and step graphs stay flat


def test_the_torch_while_loop_twin_equals_the_host_loop() -> None:
    """``LoopHRM`` (what a ``.pt2`` loop engine compiles) halts every row where the host loop over
    the PyTorch reference's segments does, with the same answers."""
    import torch

    from hrm_deploy.backends.reference import TorchStep
    from hrm_deploy.export.loop import LoopHalt
    from hrm_deploy.export.unroll import LoopHRM
    from hrm_deploy.halting import HaltRule, drive
    from hrm_deploy.model.checkpoint import load_checkpoint

    feeds = _feeds(16, seed=5)
    for model_name, rule in (("sudoku-small", "q"), ("sudoku-small", "off"), ("trm-sudoku-small", "q")):
        model, cfg = load_checkpoint(bundled_checkpoint(model_name))
        halt = LoopHalt.parse(rule, q_halt_only=cfg.halts_on_q_halt_alone)
        with torch.inference_mode():
            logits, q_halt, _, used = LoopHRM(model, halt).eval()(
                torch.from_numpy(feeds["inputs"]), torch.from_numpy(feeds["puzzle_identifiers"])
            )
        host = drive(
            TorchStep(model),
            feeds["inputs"],
            feeds["puzzle_identifiers"],
            None if rule == "off" else replace(HaltRule.parse(rule), q_halt_only=cfg.halts_on_q_halt_alone).should_halt,
        )
        assert np.array_equal(used.numpy(), host["steps_used"]), (model_name, rule)
        assert np.array_equal(logits.numpy().argmax(-1), host["logits"].argmax(-1))
        np.testing.assert_allclose(logits.numpy(), host["logits"], atol=1e-4)
        np.testing.assert_allclose(q_halt.numpy(), host["q_halt_logits"], atol=1e-4)  # NaN where NaN


def test_bench_reports_a_loop_graphs_mean_steps_beside_the_unrolled_graph(bundled_export, tmp_path: Path) -> None:
    from hrm_deploy.bench.run import BenchConfig, bench, table
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    data = tmp_path / "data"
    generate_sudoku(SudokuSpec(train=4, test=32, blanks=(10, 30), augment=0, seed=9), str(data))
    loop, unrolled = bundled_export("sudoku-small", "loop", "q"), bundled_export("sudoku-small", "unrolled")
    config = BenchConfig(
        data=str(data), batches=(1, 8), iters=2, warmup=1, include_reference=False, out_dir=str(tmp_path / "b")
    )
    report = bench([str(loop), str(unrolled)], config, quiet=True)
    steps = {Path(row["artifact"]).name: row["mean_steps"] for row in report["rows"]}
    assert steps[unrolled.name] == 8.0 and 1.0 <= steps[loop.name] < 8.0
    assert "Mean steps" in table(report)
