"""From a published name to a checked engine, offline: ``export hf:...`` -> ``build-engine`` ->
``verify --data hf:...`` through the command line, in fresh processes, against a Hugging Face cache
in huggingface_hub's on-disk layout holding a tiny HRM in the published repositories' layout
(``checkpoint`` + ``all_config.yaml``) and a tiny Sudoku-Extreme style CSV benchmark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hub_cache import add_repo, published_checkpoint_files, sudoku_csv

pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed (pip install 'hrm-deploy[hub]')")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install 'hrm-deploy[onnx]')")


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hrm_deploy", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_published_name_to_verified_engine_offline(tmp_path, tiny_model):
    home = tmp_path / "hf"
    commit = add_repo(home, "acme/HRM-checkpoint-tiny", published_checkpoint_files(tiny_model))
    add_repo(home, "acme/sudoku-tiny", {"train.csv": sudoku_csv(4), "test.csv": sudoku_csv(24, 1)}, "dataset")
    env = {
        **os.environ,
        "HF_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "HRM_DEPLOY_CACHE": str(tmp_path / "cache"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    env.pop("HF_HUB_CACHE", None)
    onnx, engine = tmp_path / "out" / "tiny.onnx", tmp_path / "out" / "tiny.fp32.cpu.onnx"
    # seq_len is not in the published files (upstream keeps it in the dataset): the named benchmark gives it
    done = _cli(
        ["export", "hf:acme/HRM-checkpoint-tiny", "--data-path", "hf:acme/sudoku-tiny", "-o", str(onnx), "-q"],
        env,
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    done = _cli(["build-engine", str(onnx), "--target", "cpu", "-o", str(engine), "-q"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    done = _cli(["verify", str(engine), "--data", "hf:acme/sudoku-tiny"], env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASSED" in done.stdout and "24 examples" in done.stdout

    hub = json.loads(onnx.with_name(onnx.name + ".manifest.json").read_text())["hub"]
    assert (hub["repo"], hub["revision"], hub["commit"]) == ("acme/HRM-checkpoint-tiny", "main", commit)
    assert set(hub["files"]) == {"checkpoint", "all_config.yaml"}
    shown = json.loads(_cli(["inspect", str(engine)], env, tmp_path).stdout)
    assert shown["manifest"]["hub"] == hub  # the engine names the published weights through its parents

    # the cached config edited after export: no verdict against it, and the PASSED report stays
    report = engine.with_name(engine.name + ".verify.json")
    passed = report.read_text()
    config = home / "hub" / "models--acme--HRM-checkpoint-tiny" / "snapshots" / commit / "all_config.yaml"
    config.write_text(config.read_text() + "\n# edited\n")
    done = _cli(["verify", str(engine), "--data", "hf:acme/sudoku-tiny"], env, tmp_path)
    assert done.returncode == 2 and "all_config.yaml changed since" in done.stderr, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr and report.read_text() == passed


def test_offline_and_not_cached_is_one_line_on_the_command_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = CliRunner().invoke(app, ["export", "hf:sapientinc/HRM-checkpoint-sudoku-extreme"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "hf download sapientinc/HRM-checkpoint-sudoku-extreme" in lines[0]
