"""Never a silently different model: a checkpoint's stored config is never contradicted or
defaulted (an override that fills a missing field is recorded, shown by inspect and verify, and
applied to the reference), and non-finite weights are refused at load, naming the tensor."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from hrm_deploy.cli import app
from hrm_deploy.errors import CheckpointError
from hrm_deploy.model.checkpoint import load_checkpoint, save_checkpoint

runner = CliRunner()


def _one_line(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and needle in result.output, result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1, result.output


def _without(path, field: str):
    """Our checkpoint at ``path`` with ``field`` dropped from its stored config."""
    obj = torch.load(path, weights_only=False)
    del obj["model_config"][field]
    torch.save(obj, path)
    return path


@pytest.mark.parametrize("field,flag", [("num_heads", "--num-heads"), ("H_cycles", "--h-cycles")])
def test_a_field_missing_from_our_checkpoint_is_never_defaulted(tiny_model, tmp_path, field, flag):
    ckpt = _without(save_checkpoint(tmp_path / "m.pt", tiny_model), field)
    with pytest.raises(CheckpointError, match=f"lacks {field}.*{flag} N"):
        load_checkpoint(ckpt)
    _one_line(runner.invoke(app, ["export", str(ckpt), "-o", str(tmp_path / "x.onnx"), "-q"]), flag)
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("flag,value", [("--num-heads", "8"), ("--h-cycles", "3"), ("--halt-max-steps", "16")])
def test_an_override_contradicting_our_checkpoints_config_is_refused(tiny_model, tmp_path, flag, value):
    ckpt = save_checkpoint(tmp_path / "m.pt", tiny_model)
    result = runner.invoke(app, ["export", str(ckpt), flag, value, "-o", str(tmp_path / "x.onnx"), "-q"])
    _one_line(result, "contradicts the checkpoint's own config")
    assert not (tmp_path / "x.onnx").exists()


def test_an_override_equal_to_the_stored_value_is_fine_and_not_recorded(tiny_model, tmp_path):
    ckpt = save_checkpoint(tmp_path / "m.pt", tiny_model)
    _, config = load_checkpoint(ckpt, num_heads=4)
    assert config.num_heads == 4
    from hrm_deploy.model.checkpoint import read_checkpoint

    assert "overrides" not in read_checkpoint(ckpt, num_heads=4).describe()


def test_an_override_contradicting_upstreams_all_config_is_refused(upstream_run, tmp_path):
    cfg = upstream_run.parent / "all_config.yaml"
    assert yaml.safe_load(cfg.read_text())["arch"]["num_heads"] == 4
    with pytest.raises(CheckpointError, match="--num-heads 8 contradicts"):
        load_checkpoint(upstream_run, num_heads=8)


@pytest.mark.slow
def test_an_override_filling_a_missing_field_is_recorded_shown_and_applied(trained_tiny, tmp_path):
    import shutil

    ckpt = tmp_path / "m.pt"
    shutil.copy(trained_tiny.checkpoint, ckpt)
    stored_heads = torch.load(ckpt, weights_only=False)["model_config"]["num_heads"]
    _without(ckpt, "num_heads")
    onnx = tmp_path / "m.onnx"
    result = runner.invoke(
        app, ["export", str(ckpt), "--num-heads", str(stored_heads), "-o", str(onnx), "--no-parity", "-q"]
    )
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "m.onnx.manifest.json").read_text())
    assert manifest["checkpoint_overrides"] == {"num_heads": stored_heads}
    shown = json.loads(runner.invoke(app, ["inspect", str(onnx)]).output)
    assert shown["manifest"]["checkpoint_overrides"] == {"num_heads": stored_heads}
    verified = runner.invoke(app, ["verify", str(onnx), "--data", trained_tiny.data, "--samples", "8"])
    assert verified.exit_code == 0, verified.output  # the reference is loaded with the same override
    assert f"num_heads={stored_heads}" in verified.output


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused_at_load_naming_the_tensor(tiny_model, tmp_path, value):
    with torch.no_grad():
        tiny_model.inner.lm_head.weight[3, 5] = value
    ckpt = save_checkpoint(tmp_path / "m.pt", tiny_model)
    with pytest.raises(CheckpointError, match="lm_head.weight holds 1 non-finite"):
        load_checkpoint(ckpt)
    for argv in (["export", str(ckpt), "-o", str(tmp_path / "x.onnx"), "-q"], ["solve", "0" * 81, str(ckpt)]):
        _one_line(runner.invoke(app, argv), "lm_head.weight")
    assert not (tmp_path / "x.onnx").exists()


def test_non_finite_upstream_weights_are_refused_too(upstream_run):
    state = torch.load(upstream_run, weights_only=False)
    key = next(k for k in state if k.endswith("H_init"))
    state[key] = torch.full_like(state[key], float("nan"))
    torch.save(state, upstream_run)
    with pytest.raises(CheckpointError, match="H_init holds"):
        load_checkpoint(upstream_run)
