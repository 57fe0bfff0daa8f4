"""No command destroys what it did not write: triton-repo's --overwrite and names, export/build-engine
outputs that are inputs or users' files, datasets through links and their staging debris,
calibrations kept out of the package, and a resumed metrics log with no step twice."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from hrm_deploy.cli import app
from hrm_deploy.errors import ArtifactError, MachineError
from hrm_deploy.manifest import manifest_path

runner = CliRunner()


def _one_line(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and needle in result.output, result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1, result.output


# ------------------------------------------------------------------------------- triton-repo
def test_triton_repo_overwrite_never_deletes_a_folder_it_did_not_write(tiny_onnx, tmp_path):
    home = tmp_path / "home"
    (home / "thesis").mkdir(parents=True)
    (home / "thesis" / "chapter1.tex").write_text("years of work")
    result = runner.invoke(app, ["triton-repo", str(tiny_onnx.unrolled), "-o", str(home), "--overwrite"])
    _one_line(result, "replaces only a repository hrm-deploy wrote")
    assert (home / "thesis" / "chapter1.tex").read_text() == "years of work"


def test_triton_repo_never_replaces_the_folder_holding_its_input(tiny_onnx, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for f in (tiny_onnx.unrolled, manifest_path(tiny_onnx.unrolled)):
        shutil.copy(f, work / Path(f).name)
    source = work / Path(tiny_onnx.unrolled).name
    before = source.read_bytes()
    result = runner.invoke(app, ["triton-repo", str(source), "-o", str(work), "--overwrite"])
    _one_line(result, "holds the input")
    assert source.read_bytes() == before


def test_triton_repo_overwrite_replaces_its_own_repository_only(tiny_onnx, tmp_path):
    repo = tmp_path / "repo"
    assert runner.invoke(app, ["triton-repo", str(tiny_onnx.unrolled), "-o", str(repo)]).exit_code == 0
    assert (repo / ".hrm-deploy-repo.json").is_file()
    again = runner.invoke(app, ["triton-repo", str(tiny_onnx.unrolled), "-o", str(repo), "--overwrite", "--name", "b"])
    assert again.exit_code == 0, again.output
    assert sorted(p.name for p in repo.iterdir()) == [".hrm-deploy-repo.json", "b"]
    (repo / "notes.txt").write_text("mine")  # something of the user's inside: no longer ours to replace
    _one_line(
        runner.invoke(app, ["triton-repo", str(tiny_onnx.unrolled), "-o", str(repo), "--overwrite"]),
        "did not write (notes.txt)",
    )
    assert (repo / "notes.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left beside it


@pytest.mark.parametrize("name", ["../x", "..", "a/b", "/tmp/x", ".hidden", "", "a b", "x" * 101])
def test_triton_repo_names_are_plain_model_names(tiny_onnx, tmp_path, name):
    result = runner.invoke(app, ["triton-repo", str(tiny_onnx.unrolled), "-o", str(tmp_path / "r"), "--name", name])
    _one_line(result, "not a plain model name")
    assert not (tmp_path / "r").exists() and not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------- export / build-engine
def test_export_never_overwrites_its_checkpoint(trained_tiny, tmp_path):
    ckpt = tmp_path / "model.pt"
    shutil.copy(trained_tiny.checkpoint, ckpt)
    before = ckpt.read_bytes()
    link = tmp_path / "link.onnx"
    link.symlink_to(ckpt)
    for out in (ckpt, link):
        _one_line(runner.invoke(app, ["export", str(ckpt), "-o", str(out), "--no-parity", "-q"]), "input")
    assert ckpt.read_bytes() == before and link.is_symlink()


def test_export_never_overwrites_a_file_it_did_not_write(trained_tiny, tmp_path):
    mine = tmp_path / "important.onnx"
    mine.write_bytes(b"my own graph")
    _one_line(
        runner.invoke(app, ["export", str(trained_tiny.checkpoint), "-o", str(mine), "--no-parity", "-q"]),
        "not an hrm-deploy artifact",
    )
    assert mine.read_bytes() == b"my own graph"


@pytest.mark.slow
def test_export_into_a_folder_writes_the_default_name_and_replaces_its_own_artifact(trained_tiny, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    argv = ["export", str(trained_tiny.checkpoint), "-o", str(folder), "--no-parity", "-q"]
    first = runner.invoke(app, argv)
    assert first.exit_code == 0, first.output
    [onnx] = folder.glob("*.onnx")
    assert manifest_path(onnx).is_file()
    again = runner.invoke(app, argv)  # our own artifact with its manifest: replaced
    assert again.exit_code == 0, again.output
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]


def test_build_engine_never_overwrites_its_input_or_a_users_file(tiny_onnx, tmp_path):
    graph = tmp_path / "tiny.onnx"
    for f in (tiny_onnx.unrolled, manifest_path(tiny_onnx.unrolled)):
        shutil.copy(f, tmp_path / Path(f).name)
    before = graph.read_bytes()
    for target in ("cpu", "desktop"):
        _one_line(runner.invoke(app, ["build-engine", str(graph), "--target", target, "-o", str(graph)]), "input")
    user = tmp_path / "notes.engine"
    user.write_text("mine")
    _one_line(runner.invoke(app, ["build-engine", str(graph), "-o", str(user)]), "not an hrm-deploy artifact")
    _one_line(runner.invoke(app, ["build-engine", str(graph), "-o", str(tmp_path)]), "is a folder")
    assert graph.read_bytes() == before and user.read_text() == "mine"


def test_publish_refuses_to_replace_the_parent_or_a_foreign_file(tmp_path):
    """The last gate every builder passes: even a caller that skipped the early checks."""
    from hrm_deploy.io import staging_dir
    from hrm_deploy.manifest import publish_artifact

    parent = tmp_path / "a.onnx"
    parent.write_bytes(b"graph")
    foreign = tmp_path / "b.onnx"
    foreign.write_bytes(b"theirs")
    for target in (parent, foreign):
        with staging_dir(tmp_path) as work:
            staged = work / "x"
            staged.write_bytes(b"new")
            with pytest.raises(ArtifactError):
                publish_artifact(staged, target, stage="test", config={}, parent=parent)
    assert parent.read_bytes() == b"graph" and foreign.read_bytes() == b"theirs"


# ------------------------------------------------------------------------------- datasets
def test_data_never_writes_through_a_symlink(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    Path("data").symlink_to(outside)
    empty = tmp_path / "empty"
    empty.mkdir()
    Path("alias").symlink_to(empty)
    for out, needle in (("data/set", "outside the workspace"), ("alias", "symbolic link")):
        _one_line(runner.invoke(app, ["data", "sudoku", "-o", out, "--train", "4", "--test", "2"]), needle)
    assert not list(outside.iterdir()) and not list(empty.iterdir())


def test_a_failed_dataset_write_leaves_no_debris(tmp_path, monkeypatch):
    from hrm_deploy.data import format as fmt
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fmt.np, "save", full_disk)
    with pytest.raises(MachineError, match="no space left"):
        generate_sudoku(SudokuSpec(train=4, test=2, blanks=(3, 5)), str(tmp_path / "ds"))
    assert list(tmp_path.iterdir()) == []


def test_a_killed_dataset_writes_staging_is_removed_by_the_next_run(tmp_path):
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    dead = 2**22 + 12345  # above the default pid_max: no such process
    debris = tmp_path / f".stage-{dead}-abcd"
    (debris / "data").mkdir(parents=True)
    generate_sudoku(SudokuSpec(train=4, test=2, blanks=(3, 5)), str(tmp_path / "ds"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]


# ------------------------------------------------------------------------------- caches
def test_calibrations_of_a_checkpoint_go_to_the_user_cache_not_beside_it(tiny_model, tmp_path, monkeypatch):
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.halting import calibration_cache
    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.solve import solve

    cache = tmp_path / "cache"
    monkeypatch.setenv("HRM_DEPLOY_CACHE", str(cache))
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    ckpt = save_checkpoint(shelf / "model.pt", tiny_model)
    data = tmp_path / "calib"
    generate_sudoku(SudokuSpec(train=16, test=4, blanks=(3, 6), seed=1), str(data))
    puzzle = "0" * 81
    solve(puzzle, ckpt, "budget:2", calib_data=data, quiet=True)
    assert [p.name for p in shelf.iterdir()] == ["model.pt"]
    assert calibration_cache(ckpt).is_relative_to(cache) and calibration_cache(ckpt).is_file()


def test_the_cache_folder_is_the_platforms_user_cache(monkeypatch, tmp_path):
    from hrm_deploy.io import cache_dir

    monkeypatch.delenv("HRM_DEPLOY_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir("halting") == tmp_path / "xdg" / "hrm-deploy" / "halting"
    monkeypatch.setenv("HRM_DEPLOY_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    import hrm_deploy

    assert not cache_dir().is_relative_to(Path(hrm_deploy.__file__).parent)


# ------------------------------------------------------------------------------- training log
@pytest.mark.slow
def test_metrics_log_continues_exactly_after_resume(tmp_path):
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.train.loop import TrainConfig, train
    from tests.train.test_train import MICRO

    data = tmp_path / "data"
    generate_sudoku(SudokuSpec(train=24, test=4, blanks=(4, 8)), str(data))
    out = tmp_path / "run"
    cfg = TrainConfig(
        data_path=str(data), out_dir=str(out), steps=6, global_batch_size=8, eval_samples=4, checkpoint_minutes=0
    )
    model_config = MICRO
    first = train(model_config, cfg, stop_after=3, progress=False)
    log = out / "metrics.jsonl"
    # a kill after the checkpoint: steps 4 and 5 logged, never checkpointed; a torn last line
    with log.open("a") as f:
        f.write(json.dumps({"step": 4}) + "\n" + json.dumps({"step": 5}) + "\n" + '{"step": 6, "lo')
    train(model_config, cfg, resume=str(first.checkpoint), progress=False)
    steps = [json.loads(line).get("step") for line in log.read_text().splitlines() if '"final"' not in line]
    assert steps == [1, 2, 3, 4, 5, 6], steps
    assert np.all(np.diff(steps) == 1)


def test_an_empty_existing_folder_takes_a_repository(tiny_onnx, tmp_path):
    """An empty existing folder is fine to write into (nothing to destroy)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(app, ["triton-repo", str(tiny_onnx.unrolled), "-o", str(empty)])
    assert result.exit_code == 0, result.output
    assert (empty / ".hrm-deploy-repo.json").is_file()


def test_a_users_file_named_like_a_manifest_is_never_removed(tmp_path):
    from hrm_deploy.manifest import check_replaceable

    out = tmp_path / "m.onnx"
    manifest_path(out).write_text("my notes")
    with pytest.raises(ArtifactError, match="not an hrm-deploy manifest"):
        check_replaceable(out)
    assert manifest_path(out).read_text() == "my notes"


def test_data_under_a_file_is_one_line_before_the_work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("afile").write_text("x")
    _one_line(runner.invoke(app, ["data", "sudoku", "-o", "afile/ds", "--train", "4", "--test", "2"]), "is a file")
    assert Path("afile").read_text() == "x"
