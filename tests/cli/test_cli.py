"""The CLI end to end: one-line errors, export of the bundled default, inspect."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from hrm_deploy.cli import app

runner = CliRunner()


@pytest.mark.slow
def test_bad_checkpoint_is_one_line_no_traceback(tmp_path):
    bad = tmp_path / "step_3"
    bad.write_bytes(b"\x00" * 10)
    result = subprocess.run(
        [sys.executable, "-m", "hrm_deploy", "export", str(bad), "-q"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_export_bundled_default_then_inspect(tmp_path):
    out = tmp_path / "tiny.onnx"
    result = runner.invoke(app, ["export", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    assert "parity vs PyTorch" in result.output and out.is_file()
    info = runner.invoke(app, ["inspect", str(out)])
    data = json.loads(info.stdout)
    assert data["kind"] == "onnx" and data["inputs"]["inputs"].startswith("INT32")
    assert data["manifest"]["stage"] == "export"
    ckpt = json.loads(runner.invoke(app, ["inspect", str(tmp_path / "tiny.onnx.manifest.json")]).stdout)
    assert ckpt["kind"] == "manifest"


def test_inspect_checkpoint(upstream_run):
    data = json.loads(runner.invoke(app, ["inspect", str(upstream_run.parent)]).stdout)
    assert data["kind"] == "checkpoint (upstream)" and data["parameters"] > 0 and data["config"]["seq_len"] == 81


@pytest.mark.slow
def test_data_and_train_commands(tmp_path):
    data = tmp_path / "d"
    r = runner.invoke(
        app,
        ["data", "sudoku", "-o", str(data), "--train", "20", "--test", "4", "--max-blanks", "6", "--min-blanks", "4"],
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(
        app, ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--steps", "2", "--batch-size", "8"]
    )
    assert r.exit_code == 0, r.output
    assert (tmp_path / "run" / "last.pt").is_file()
    r = runner.invoke(app, ["train", "--data", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "dataset.json" in r.output


@pytest.mark.slow
def test_build_engine_refuses_int8_without_calibration_data(tiny_model, tmp_path):
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.model.checkpoint import save_checkpoint

    # a checkpoint with no provenance (no dataset spec, no data path): the flag must be named
    ckpt = save_checkpoint(tmp_path / "bare.pt", tiny_model)
    onnx = export_onnx(ckpt, tmp_path / "bare.onnx", ExportConfig(parity=False), quiet=True).path
    result = runner.invoke(app, ["build-engine", str(onnx), "--int8", "-q"])
    assert result.exit_code == 2 and "--calib-data" in result.output and "Traceback" not in result.output
    assert "records no dataset" in result.output


def test_build_engine_rejects_two_precisions(tiny_onnx):
    result = runner.invoke(app, ["build-engine", str(tiny_onnx.unrolled), "--int8", "--fp16"])
    assert result.exit_code == 2 and "choose one precision" in result.output
