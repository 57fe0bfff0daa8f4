"""``arc-eval --halt``: per-row ACT halting, an option that can change scores, never the default.

A tiny HRM whose q head is planted (random weights, no bias) halts some rows after step 1 of 2 and
runs others to the end; the default run on it still runs every step."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from hrm_deploy.arc.evaluate import ArcEvalConfig, arc_eval, output_paths
from hrm_deploy.errors import ConfigError
from tests.arc.conftest import random_arc_model


@pytest.fixture
def halting_model(tmp_path):
    """(checkpoint, dataset, tmp_path): the random tiny HRM of the ARC tests (2 ACT steps) with a
    planted q head: its halt bias set so that q_halt > q_continue after step 1 on half the test rows."""
    import torch

    from hrm_deploy.backends import open_runner
    from hrm_deploy.data.format import load_split
    from hrm_deploy.model.checkpoint import load_checkpoint, save_checkpoint

    checkpoint, data, tmp = random_arc_model(tmp_path)
    model, _ = load_checkpoint(checkpoint)
    head = next(m for name, m in model.named_modules() if name.endswith("q_head"))
    with torch.no_grad():  # a q head that reads its input (a fresh one is zero: the same q for every row)
        head.weight.copy_(torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(0)))
    planted = save_checkpoint(tmp / "planted.pt", model.eval())
    split = load_split(data, "test")
    with open_runner(planted) as runner:
        out = runner.infer({"inputs": np.asarray(split.inputs), "puzzle_identifiers": split.example_puzzle_ids()})
    margin = out["q_halt_logits"][:, 0] - out["q_continue_logits"][:, 0]  # [rows] after step 1
    with torch.no_grad():
        head.bias[0] -= float(np.median(margin))
    return save_checkpoint(planted, model.eval()), data, tmp


@pytest.mark.slow
def test_halt_q_stops_rows_early_labels_the_report_and_keeps_the_default(halting_model):
    checkpoint, data, tmp = halting_model
    full = arc_eval(checkpoint, data, tmp / "all.json", config=ArcEvalConfig(ks=(1, 2), quiet=True))
    assert "halting" not in full and "halting on" not in output_paths(tmp / "all.json")["report_md"].read_text()
    assert full["cost"]["tasks"]["ev000000"]["act_steps"] == 2 * full["cost"]["tasks"]["ev000000"]["rows"]

    halted = arc_eval(checkpoint, data, tmp / "q.json", config=ArcEvalConfig(ks=(1, 2), quiet=True, halt="q"))
    halting = halted["halting"]
    assert halting["rule"] == "q" and halting["max_act_steps"] == 2
    assert 1.0 < halting["mean_act_steps"] < 2.0  # some rows stopped after step 1, some ran on
    steps_run = sum(task["act_steps"] for task in halted["cost"]["tasks"].values())
    assert steps_run == pytest.approx(halting["mean_act_steps"] * halted["prediction_rows"], abs=0.01)
    markdown = output_paths(tmp / "q.json")["report_md"].read_text()
    assert markdown.startswith("# ARC evaluation (per-row halting: --halt q)")
    assert "halting on (--halt q)" in markdown and "can differ from the all-steps vote" in markdown
    assert json.loads(output_paths(tmp / "q.json")["report_json"].read_text())["halting"]["rule"] == "q"

    # a rule that never fires before the last step is the all-steps run
    never = arc_eval(
        checkpoint, data, tmp / "never.json", config=ArcEvalConfig(ks=(1, 2), quiet=True, halt="threshold:0.999999")
    )
    assert never["halting"]["mean_act_steps"] == 2.0 and never["pass_at"] == full["pass_at"]
    assert (tmp / "never.json").read_text() == (tmp / "all.json").read_text()


@pytest.mark.slow
def test_saved_predictions_of_another_rule_are_never_mixed_in(halting_model):
    checkpoint, data, tmp = halting_model
    out = tmp / "s.json"
    arc_eval(checkpoint, data, out, config=ArcEvalConfig(ks=(1,), quiet=True, halt="q"))
    with pytest.raises(ConfigError, match=r"made with --halt q and this run asks for --halt off; pass --restart"):
        arc_eval(checkpoint, data, out, config=ArcEvalConfig(ks=(1,), quiet=True))
    with pytest.raises(ConfigError, match=r"made with --halt q and this run asks for --halt threshold:0.5"):
        arc_eval(checkpoint, data, out, config=ArcEvalConfig(ks=(1,), quiet=True, halt="threshold:0.5"))
    again = arc_eval(
        checkpoint, data, out, config=ArcEvalConfig(ks=(1,), quiet=True, halt="threshold:0.5", restart=True)
    )
    assert again["halting"]["rule"] == "threshold:0.5"


@pytest.mark.slow
def test_early_stop_with_halting_equals_the_full_halting_run(halting_model):
    """The early stop reasons about votes only: given the same per-row (halted) predictions it stays exact."""
    checkpoint, data, tmp = halting_model
    config = ArcEvalConfig(ks=(1, 2), quiet=True, halt="q", batch=4)
    full = arc_eval(checkpoint, data, tmp / "full.json", config=config)
    early = arc_eval(checkpoint, data, tmp / "early.json", config=dataclasses.replace(config, early_stop=True))
    assert early["pass_at"] == full["pass_at"] and early["halting"]["rule"] == "q"
    assert (tmp / "early.json").read_text() == (tmp / "full.json").read_text()
    assert early["early_stop"]["rows_run"] + early["early_stop"]["rows_skipped"] == full["prediction_rows"]


def test_what_cannot_halt_per_row_is_refused_in_one_line(arc_run):
    from hrm_deploy.arc.sources import open_source

    checkpoint, data, tmp = arc_run
    with pytest.raises(ConfigError, match=r"a server halts by its own `serve --halt` rule"):
        open_source("http://127.0.0.1:9", {}, halt="q")
    with pytest.raises(ConfigError, match="unknown rule"):
        arc_eval(checkpoint, data, tmp / "x.json", config=ArcEvalConfig(quiet=True, halt="sometimes"))
    with pytest.raises(ConfigError, match=r"no calibrated threshold for it; calibrate one"):
        arc_eval(checkpoint, data, tmp / "x.json", config=ArcEvalConfig(quiet=True, halt="budget:1"))


@pytest.mark.slow
def test_graphs_unrolled_refused_step_halts_loop_by_its_own_rule(halting_model):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx

    checkpoint, data, tmp = halting_model
    unrolled = export_onnx(checkpoint, tmp / "unrolled.onnx", ExportConfig(parity=False), quiet=True).path
    with pytest.raises(ConfigError, match=r"unrolled onnx: every row runs all 2 ACT steps, it cannot halt per row"):
        arc_eval(unrolled, data, tmp / "u.json", config=ArcEvalConfig(quiet=True, halt="q"))
    config = ArcEvalConfig(ks=(1, 2), quiet=True, halt="q")
    reference = arc_eval(checkpoint, data, tmp / "ref.json", config=config)
    step = export_onnx(checkpoint, tmp / "step.onnx", ExportConfig(mode="step", parity=False), quiet=True).path
    got = arc_eval(step, data, tmp / "step.json", against=checkpoint, config=config)
    assert got["halting"] == reference["halting"] and got["pass_at"] == reference["pass_at"]
    assert got["passed"] and (tmp / "step.json").read_text() == (tmp / "ref.json").read_text()

    loop = export_onnx(checkpoint, tmp / "loop.onnx", ExportConfig(mode="loop", halt="q", parity=False), quiet=True)
    with pytest.raises(ConfigError, match=r"loop graph: it halts by its own rule \(q, fixed at export\)"):
        arc_eval(loop.path, data, tmp / "l.json", config=ArcEvalConfig(quiet=True))  # the default runs every step
    args = ["arc-eval", str(loop.path), "--data", str(data), "-o", str(tmp / "l.json"), "--k", "1,2", "-q"]
    result = CliRunner().invoke(app, [*args, "--halt", "q"])
    assert result.exit_code == 0, result.output
    assert "per-row halting: --halt q" in result.output
    assert json.loads((tmp / "l.json").read_text()) == json.loads((tmp / "ref.json").read_text())
    records = np.fromfile(
        output_paths(tmp / "l.json")["preds"], dtype=[("row", "<i8"), ("q", "<f8"), ("p", "u1", 25), ("steps", "<i2")]
    )
    assert set(records["steps"]) == {1, 2}
