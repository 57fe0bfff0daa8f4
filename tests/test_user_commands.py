"""The user's three command lines, exactly as written, in a fresh workspace,
and where default data comes from (hrm_deploy.provenance)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hrm_deploy
from hrm_deploy.errors import ConfigError

TINY = str(Path(hrm_deploy.__file__).parent / "train" / "presets" / "sudoku-tiny.pt")


def _cli(workspace: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("hrm-deploy")
    argv = [exe, *args] if exe else [sys.executable, "-m", "hrm_deploy", *args]
    return subprocess.run(argv, check=False, cwd=workspace, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_three_command_lines_as_written(tmp_path):
    pytest.importorskip("tensorrt_rtx", reason="build-engine needs the TensorRT-RTX builder (pip install tensorrt-rtx)")
    workspace = tmp_path / "fresh"
    workspace.mkdir()
    shutil.copy(TINY, workspace / "ckpt.pt")  # the one-step fixture keeps calibration quick
    env = {**os.environ, "HRM_DEPLOY_CACHE": str(tmp_path / "cache")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])

    run = _cli(workspace, env, "export", "ckpt.pt")
    assert run.returncode == 0, run.stderr
    assert (workspace / "export" / "ckpt.onnx").is_file()

    run = _cli(workspace, env, "build-engine", "--int8")
    assert run.returncode == 0, run.stderr
    announced = [line for line in run.stderr.splitlines() if line.startswith("no --calib-data given")]
    assert len(announced) == 1 and "ckpt.pt's own dataset" in announced[0] and "3-6 blanks" in announced[0]
    engines = list((workspace / "engines").glob("ckpt.int8.*.engine"))
    assert len(engines) == 1 and engines[0].stat().st_size > 0
    assert list((tmp_path / "cache" / "datasets").glob("sudoku-*/test/dataset.json"))

    run = _cli(workspace, env, "bench", "--target", "jetson")
    from hrm_deploy.bench.jetson import jetson_model

    if jetson_model() is None:  # off a Jetson: one clear line naming the command to run instead
        assert run.returncode == 2 and "Traceback" not in run.stderr
        assert len(run.stderr.strip().splitlines()) == 1
        assert "hrm-deploy bench --target jetson --host USER@JETSON" in run.stderr
        assert "Missing option" not in run.stderr
    else:
        assert run.returncode == 0, run.stderr


@pytest.mark.slow
def test_default_data_from_each_kind_of_provenance(tmp_path, tiny_model, upstream_run, monkeypatch):
    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.provenance import default_data

    monkeypatch.setenv("HRM_DEPLOY_CACHE", str(tmp_path / "cache"))
    # a bundled preset: its dataset spec regenerated deterministically (twice: cached)
    first = default_data(TINY, "--data")
    assert (first.path / "test" / "dataset.json").is_file() and "regenerated" in first.message
    assert default_data(TINY, "--data").path == first.path
    # an upstream checkpoint: all_config.yaml's data_path, resolved as the loader does
    up = default_data(upstream_run, "--data")
    assert up.path.resolve() == (tmp_path / "data" / "sudoku-tiny").resolve() and "--data" in up.message
    # our trainer's checkpoints record their data path
    data = tmp_path / "mydata"
    (data / "train").mkdir(parents=True)
    (data / "train" / "dataset.json").write_text("{}")
    ours = save_checkpoint(tmp_path / "ours.pt", tiny_model, train_config={"data_path": str(data)})
    assert default_data(ours, "--calib-data").path == data
    # nothing recorded: one error naming the flag
    bare = save_checkpoint(tmp_path / "bare.pt", tiny_model)
    with pytest.raises(ConfigError, match="pass --calib-data DATASET_DIR"):
        default_data(bare, "--calib-data")
    gone = save_checkpoint(tmp_path / "gone.pt", tiny_model, train_config={"data_path": str(tmp_path / "nope")})
    with pytest.raises(ConfigError, match="not here.*pass --data"):
        default_data(gone, "--data")


@pytest.mark.slow
def test_every_writing_command_takes_dash_o():
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    runner = CliRunner()
    for command in (
        ["export"],
        ["build-engine"],
        ["bench"],
        ["train"],
        ["data", "sudoku"],
        ["data", "maze"],
        ["solve"],
        ["triton-repo"],
    ):
        text = runner.invoke(app, [*command, "--help"], terminal_width=200).output
        assert re.search(r"(?<!-)-o\b", text) and "--out" in text, command


@pytest.mark.slow
def test_budget_calibrates_on_fresh_puzzles_of_the_checkpoint_spec(tmp_path, monkeypatch):
    from hrm_deploy.provenance import default_data, heldout_data
    from hrm_deploy.solve import solve

    monkeypatch.setenv("HRM_DEPLOY_CACHE", str(tmp_path / "cache"))
    ckpt = tmp_path / "ckpt.pt"
    shutil.copy(TINY, ckpt)
    fresh = heldout_data(ckpt, samples=64)
    assert fresh is not None and "never trained on" in fresh.message
    assert fresh.path != default_data(ckpt, "--data").path
    solve("175604839462893157893751642930517264624938715751206983089175426246389571517462390", ckpt, "budget:1")
    from hrm_deploy.halting import calibration_cache

    assert calibration_cache(ckpt).is_relative_to(tmp_path / "cache")  # the user cache, not beside it
    [entry] = json.loads(calibration_cache(ckpt).read_text())["budgets"].values()
    assert Path(entry["data"]).parent == fresh.path.parent and entry["examples"] == 512
