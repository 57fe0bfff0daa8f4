"""``arc-eval`` end to end: a tiny random HRM on a small-canvas ARC dataset built from self-made tasks."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hrm_deploy.arc.evaluate import ArcEvalConfig, arc_eval, output_paths, parse_ks
from hrm_deploy.errors import ConfigError, DataError
from tests.arc.conftest import SIDE


def test_checkpoint_end_to_end_resume_and_perfect_predictions(arc_run, monkeypatch):
    checkpoint, data, tmp = arc_run
    out = tmp / "out" / "submission.json"
    report = arc_eval(checkpoint, data, out, config=ArcEvalConfig(ks=(1, 2), quiet=True))
    submission = json.loads(out.read_text())
    assert sorted(submission) == ["ev000000", "ev000001"] and len(submission["ev000001"]) == 2
    assert all(set(entry) == {"attempt_1", "attempt_2"} for entries in submission.values() for entry in entries)
    assert report["task_score"] == "all" and report["prediction_rows"] == 12
    paths = output_paths(out)
    assert json.loads(paths["report_json"].read_text())["pass_at"] == report["pass_at"]
    assert "pass@2" in paths["report_md"].read_text()

    # resumed: a complete predictions file runs nothing; a cut-short one runs only the rest
    import hrm_deploy.backends as runners

    real_open = runners.open_runner
    monkeypatch.setattr(runners, "open_runner", lambda *a, **k: pytest.fail("ran the model again"))
    assert arc_eval(checkpoint, data, out, config=ArcEvalConfig(ks=(1, 2), quiet=True))["pass_at"] == report["pass_at"]
    saved = paths["preds"].read_bytes()
    record = len(saved) // 12
    paths["preds"].write_bytes(saved[: 7 * record + 5])  # 7 rows and part of the 8th
    calls = []

    def counting(*args, **kwargs):
        runner = real_open(*args, **kwargs)
        infer = runner.infer
        runner.infer = lambda feeds, **kw: calls.append(len(feeds["inputs"])) or infer(feeds, **kw)
        return runner

    monkeypatch.setattr(runners, "open_runner", counting)
    arc_eval(checkpoint, data, out, config=ArcEvalConfig(ks=(1, 2), batch=4, quiet=True))
    assert calls == [4, 1] and paths["preds"].read_bytes() == saved

    # predictions equal to the (augmented) labels: every task passes at k=1
    from hrm_deploy.arc.evaluate import _record_dtype
    from hrm_deploy.data.format import load_split

    records = np.fromfile(paths["preds"], dtype=_record_dtype(SIDE * SIDE))
    records["pred"] = load_split(data, "test").labels
    records.tofile(paths["preds"])
    perfect = arc_eval(checkpoint, data, out, config=ArcEvalConfig(ks=(1, 2), quiet=True))
    assert perfect["pass_at"] == {"1": 1.0, "2": 1.0}
    task = json.loads((data / "../src/evaluation/ev000001.json").read_text())
    assert json.loads(out.read_text())["ev000001"][1]["attempt_1"] == task["test"][1]["output"]


@pytest.mark.slow
def test_onnx_matches_checkpoint_and_against(arc_run):
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx

    checkpoint, data, tmp = arc_run
    onnx = export_onnx(checkpoint, tmp / "model.onnx", ExportConfig(parity=False), quiet=True).path
    config = ArcEvalConfig(quiet=True)
    ref = arc_eval(checkpoint, data, tmp / "ref.json", config=config)
    got = arc_eval(onnx, data, tmp / "onnx.json", against=checkpoint, config=config)
    assert got["pass_at"] == ref["pass_at"] and got["reference_pass_at"] == ref["pass_at"]
    assert got["pass2_difference_points"] == 0.0 and got["passed"] is True
    assert (tmp / "onnx.json").read_text() == (tmp / "ref.json").read_text()


def test_bad_inputs_are_one_clear_error(arc_run):
    from hrm_deploy.model.checkpoint import load_checkpoint, save_checkpoint
    from hrm_deploy.model.hrm import build_model

    checkpoint, data, tmp = arc_run
    _, config = load_checkpoint(checkpoint)
    small = save_checkpoint(tmp / "small.pt", build_model(config.replace(num_puzzle_identifiers=3), seed=0))
    with pytest.raises(DataError, match=r"puzzle-embedding table has 3 rows"):
        arc_eval(small, data, tmp / "s.json", config=ArcEvalConfig(quiet=True))
    with pytest.raises(ConfigError, match="include 2"):
        arc_eval(checkpoint, data, tmp / "s.json", against=checkpoint, config=ArcEvalConfig(ks=(1,), quiet=True))
    with pytest.raises(ConfigError, match="between 0 and 100"):
        arc_eval(checkpoint, data, tmp / "s.json", config=ArcEvalConfig(max_pass2_difference_points=-1))
    with pytest.raises(ConfigError, match="positive integers"):
        parse_ks("1,x")
    arc_eval(checkpoint, data, tmp / "s.json", config=ArcEvalConfig(ks=(1,), quiet=True))
    other = save_checkpoint(tmp / "other.pt", build_model(config, seed=1))
    with pytest.raises(ConfigError, match="--restart"):
        arc_eval(other, data, tmp / "s.json", config=ArcEvalConfig(ks=(1,), quiet=True))
    arc_eval(other, data, tmp / "s.json", config=ArcEvalConfig(ks=(1,), restart=True, quiet=True))


def test_cli(arc_run):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    checkpoint, data, tmp = arc_run
    args = ["arc-eval", str(checkpoint), "--data", str(data), "-o", str(tmp / "c.json"), "--k", "1,2", "-q"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "pass@1" in result.output and (tmp / "c.json").is_file()
    result = CliRunner().invoke(app, [*args[:-3], "--k", "0", "-q"])
    assert result.exit_code != 0 and "positive integers" in result.output


def test_scores_upstreams_saved_predictions(arc_run, tmp_path):
    """Upstream's own eval outputs (a torch.save dict per rank) score like our saved predictions."""
    import torch

    from hrm_deploy.arc.evaluate import _record_dtype, score_saved_predictions
    from hrm_deploy.data.format import load_split

    checkpoint, data, tmp = arc_run
    report = arc_eval(checkpoint, data, tmp / "s.json", config=ArcEvalConfig(ks=(1, 2), quiet=True))
    records = np.fromfile(output_paths(tmp / "s.json")["preds"], dtype=_record_dtype(SIDE * SIDE))
    split = load_split(data, "test")
    logits = torch.nn.functional.one_hot(torch.from_numpy(records["pred"].astype(np.int64)), 12).float()
    half = len(records) // 2
    files = []
    for rank, rows in enumerate((slice(0, half), slice(half, None))):
        saved = {
            "puzzle_identifiers": torch.from_numpy(split.example_puzzle_ids()[rows]),
            "inputs": torch.from_numpy(np.asarray(split.inputs[rows]).astype(np.int32)),
            "logits": logits[rows],
            "q_halt_logits": torch.from_numpy(np.ascontiguousarray(records["q_halt"][rows])).float(),
        }
        files.append(tmp_path / f"step_2_all_preds.{rank}")
        torch.save(saved, files[-1])
    got = score_saved_predictions(files, data, ArcEvalConfig(ks=(1, 2)))
    assert {str(k): v for k, v in got.pass_at.items()} == report["pass_at"]
    assert got.submission == json.loads((tmp / "s.json").read_text())
    torch.save({"inputs": torch.zeros(1)}, tmp_path / "bad")
    with pytest.raises(DataError, match="lacks puzzle_identifiers"):
        score_saved_predictions([tmp_path / "bad"], data)
