"""One rule for ``-o`` in every command that takes it (``manifest.output_path``): ``-o NEWDIR/`` (or an
existing folder) is a folder, never a file named NEWDIR. A command whose output is one file writes its
default name inside (the folder made) or, without a default name, refuses in one line; a command whose
output is a folder writes that folder; a file where a folder is meant is one line. Where a command's
work is long, the library function it calls is replaced by one that records what it got."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hrm_deploy.cli import app
from tests.arc.conftest import arc_run  # noqa: F401 - fixture
from tests.cli.test_run_folders import _called, _stand_in
from tests.reliability.test_never_destroy import _one_line

runner = CliRunner()
PUZZLE = "175604839462893157893751642930517264624938715751206983089175426246389571517462390"


# -- commands whose output is one file ----------------------------------------------------------------------
def test_export_writes_its_default_name_into_a_new_folder(tmp_path):
    result = runner.invoke(app, ["export", "--model", "sudoku-tiny", "--no-parity", "-q", "-o", f"{tmp_path}/new/"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "new" / "sudoku-tiny.onnx").is_file()


def test_arc_eval_writes_its_default_submission_into_a_new_folder(arc_run, tmp_path):  # noqa: F811
    checkpoint, data, _ = arc_run
    result = runner.invoke(app, ["arc-eval", str(checkpoint), "--data", str(data), "-o", f"{tmp_path}/subs/"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "subs" / f"{checkpoint.name}.arc-submission.json").is_file()
    assert not (tmp_path / "subs").is_file()


@pytest.mark.parametrize(
    "argv",
    [["solve", PUZZLE, "-o", "{new}/"], ["build-engine", "{graph}", "--target", "cpu", "-o", "{new}/"]],
    ids=["solve", "build-engine"],
)
def test_a_command_without_a_default_file_name_refuses_a_folder(tiny_onnx, tmp_path, argv):
    argv = [a.format(new=tmp_path / "new", graph=tiny_onnx.unrolled) for a in argv]
    _one_line(runner.invoke(app, argv), "names a folder; give the output's file name inside it")
    assert not (tmp_path / "new").exists()  # never a file named NEWDIR


@pytest.mark.parametrize("command", ["export", "solve", "arc-eval"])
def test_a_file_where_a_folder_is_meant_is_one_line(tmp_path, command):
    mine = tmp_path / "mine"
    mine.write_text("my notes")
    argv = {
        "export": ["export", "--model", "sudoku-tiny", "--no-parity", "-o", f"{mine}/"],
        "solve": ["solve", PUZZLE, "-o", f"{mine}/"],
        "arc-eval": ["arc-eval", "ckpt.pt", "--data", str(tmp_path), "-o", f"{mine}/"],
    }[command]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert mine.read_text() == "my notes"


# -- commands whose output is a folder ----------------------------------------------------------------------
FOLDER_COMMANDS = {
    "bench": ("hrm_deploy.bench.run.bench", ["bench", "{graph}", "-o", "{out}"]),
    "profile": ("hrm_deploy.bench.profile.profile", ["profile", "{graph}", "-o", "{out}"]),
    "train": ("hrm_deploy.train.presets.train_configs", ["train", "--data", "{tmp}", "-o", "{out}"]),
    "adapt": ("hrm_deploy.arc.adapt.adapt", ["adapt", "{ckpt}", "--tasks", "{tmp}", "-o", "{out}"]),
    "triton-repo": ("hrm_deploy.serve.repo.write_triton_repo", ["triton-repo", "{graph}", "-o", "{out}"]),
    "data arc": ("hrm_deploy.data.arc.build_arc", ["data", "arc", "--source", "{tasks}", "-o", "{out}"]),
}


def _folder_argv(command, tiny_onnx, tmp_path, out):
    from tests.arc.test_data import make_tasks

    target, argv = FOLDER_COMMANDS[command]
    ckpt = tmp_path / "base.pt"
    ckpt.write_bytes(b"")
    tasks = make_tasks(tmp_path / "tasks", n_train=1, n_eval=1) if command == "data arc" else tmp_path
    fill = dict(graph=tiny_onnx.unrolled, out=out, tmp=tmp_path, ckpt=ckpt, tasks=tasks)
    return target, [a.format(**fill) for a in argv]


@pytest.mark.parametrize("command", sorted(FOLDER_COMMANDS))
def test_a_folder_command_takes_new_dir_slash_as_its_folder(tiny_onnx, tmp_path, monkeypatch, command):
    target, argv = _folder_argv(command, tiny_onnx, tmp_path, f"{tmp_path}/new/")
    monkeypatch.setattr(target, _stand_in)
    called = _called(argv)
    given = [*called.args_, *called.kwargs.values()]
    wanted = str(tmp_path / "new")
    assert any(wanted == str(getattr(v, "out_dir", getattr(v, "out", v))) for v in given) or wanted in repr(given)
    assert not (tmp_path / "new").is_file()


def test_data_writes_its_dataset_into_new_dir_slash(tmp_path):
    argv = ["data", "sudoku", "--train", "2", "--test", "2", "--workers", "1", "-o", f"{tmp_path}/new/"]
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "new" / "train" / "dataset.json").is_file()


@pytest.mark.parametrize("command", [*sorted(FOLDER_COMMANDS), "data sudoku"])
def test_a_folder_command_refuses_a_file_in_one_line(tiny_onnx, tmp_path, monkeypatch, command):
    mine = tmp_path / "mine"
    mine.write_text("my notes")
    if command == "data sudoku":  # its check is in the library: the real command, refused before any work
        argv = ["data", "sudoku", "--train", "2", "--test", "2", "--workers", "1", "-o", f"{mine}/"]
    else:
        target, argv = _folder_argv(command, tiny_onnx, tmp_path, f"{mine}/")
        monkeypatch.setattr(target, _stand_in)
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "is a file, not a folder" in result.output, result.output
    assert mine.read_text() == "my notes"
