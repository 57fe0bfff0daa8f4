"""Faults of the machine are one line naming the path, the cause and the fix (exit 2): a read-only
folder, a full disk, link loops, a file in the way. Nothing is blamed wrongly (a full disk is never
"re-export your input"), verify prints its verdict even where it cannot save its report, and the
debris of killed builds is removed. Real read-only and tiny tmpfs mounts where this process may
mount (root, as in CI), else those cases skip; the errno mapping is tested by injection everywhere."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hrm_deploy.cli import app
from hrm_deploy.errors import MachineError, install_hint, machine_fault
from hrm_deploy.io import clean_debris, write_text
from tests.reliability.test_never_destroy import _one_line

runner = CliRunner()
PUZZLE = "175604839462893157893751642930517264624938715751206983089175426246389571517462390"


def _mount(where: Path, options: str) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root (CI runs as root); the errno mapping is tested by injection")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()})")
    return where


@pytest.fixture
def read_only(tmp_path):
    where = _mount(tmp_path / "ro", "size=1m,ro")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture
def full_disk(tmp_path):
    where = _mount(tmp_path / "full", "size=2m")
    (where / "filler").write_bytes(b"\0" * ((2 << 20) - (16 << 10)))  # leave 16 KiB
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.mark.parametrize(
    "name,cause",
    [
        ("ENOSPC", "no space left"),
        ("EROFS", "read-only"),
        ("EACCES", "permission denied"),
        ("ENOTDIR", "not a folder"),
        ("ELOOP", "symbolic links"),
        ("EMFILE", "too many open files"),
        ("ENAMETOOLONG", "too long"),
    ],
)
def test_each_fault_is_one_line_naming_the_path(name, cause):
    fault = machine_fault(OSError(getattr(errno, name), os.strerror(getattr(errno, name))), "/data/out.onnx")
    assert isinstance(fault, MachineError)
    assert str(fault).startswith("/data/out.onnx: ") and cause in str(fault) and "\n" not in str(fault)
    assert machine_fault(FileNotFoundError(errno.ENOENT, "x")) is None  # a bug's error keeps its traceback


def test_an_injected_full_disk_on_write_is_one_line(tmp_path, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # write() errors carry no file name

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(MachineError, match=r"answers\.txt: no space left"):
        write_text(tmp_path / "answers.txt", "x")
    assert not [p for p in tmp_path.iterdir()]  # no temp file left


def test_read_only_folder_for_every_writer(read_only, tiny_onnx):
    for args in (
        ["export", "-o", str(read_only / "m.onnx")],
        ["build-engine", str(tiny_onnx.unrolled), "--target", "cpu", "--fp32", "-o", str(read_only / "m.cpu.onnx")],
        ["data", "sudoku", "-o", str(read_only / "d"), "--train", "4", "--test", "4"],
        ["solve", PUZZLE, "-o", str(read_only / "answers.txt")],
        ["triton-repo", str(tiny_onnx.unrolled), "-o", str(read_only / "repo")],
    ):
        _one_line(runner.invoke(app, args), "read-only")


def test_verify_prints_its_verdict_where_it_cannot_save_the_report(tmp_path, tiny_onnx):
    from hrm_deploy.artifacts import find_reference

    folder = tmp_path / "ro"
    folder.mkdir()
    for f in (tiny_onnx.unrolled, Path(str(tiny_onnx.unrolled) + ".manifest.json")):
        shutil.copy(f, folder / f.name)
    where = _mount(tmp_path / "mnt", "size=4m")
    try:
        shutil.copytree(folder, where, dirs_exist_ok=True)
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        artifact = where / tiny_onnx.unrolled.name
        # the copy's relative parent link no longer reaches the checkpoint from the mount: name it
        # (it resolved only where the repository's depth happened to match the mount's)
        reference = find_reference(tiny_onnx.unrolled)
        args = ["verify", str(artifact), "--data", tiny_onnx.data, "--samples", "8", "--against", str(reference)]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "PASSED" in result.output and "will not be saved" in result.output and "Traceback" not in result.output
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_is_never_blamed_on_the_input(full_disk, tiny_onnx):
    result = runner.invoke(
        app, ["build-engine", str(tiny_onnx.unrolled), "--target", "cpu", "--fp32", "-o", str(full_disk / "m.cpu.onnx")]
    )
    _one_line(result, "no space left")
    assert "re-export" not in result.output
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]  # no staging left


@pytest.mark.slow
def test_link_loops_and_files_in_the_way(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.symlink("loop", tmp_path / "loop")
    _one_line(runner.invoke(app, ["solve", PUZZLE, "-o", "loop/answers.txt"]), "symbolic links")
    (tmp_path / "afile").write_text("x")
    _one_line(runner.invoke(app, ["solve", PUZZLE, "-o", "afile/answers.txt"]), "afile")
    assert (tmp_path / "afile").read_text() == "x"


def test_staging_debris_of_killed_builds_is_removed(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    for kind in ("cpu-build", "torch-engine", "build", "stage"):
        (tmp_path / f".{kind}-{dead.pid}-abcd").mkdir()
    (tmp_path / f".{'cpu-build'}-{os.getpid()}-live").mkdir()  # a live writer's: kept
    removed = {p.name for p in clean_debris(tmp_path)}
    assert removed == {f".{k}-{dead.pid}-abcd" for k in ("cpu-build", "torch-engine", "build", "stage")}
    assert (tmp_path / f".cpu-build-{os.getpid()}-live").is_dir()


def test_a_run_without_a_checkpoint_is_not_sent_to_resume_it(tmp_path):
    from hrm_deploy.errors import ConfigError
    from hrm_deploy.train.checkpointer import check_out_dir

    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')  # a first run stopped before its first save
    with pytest.raises(ConfigError, match="no checkpoint to resume") as info:
        check_out_dir(tmp_path, overwrite=False, resume=None)
    assert "--resume" not in str(info.value)


def test_the_missing_extra_hint_matches_the_installation(tmp_path):
    """From a source checkout (an editable install) 'hrm-deploy[rtx]' would ask the index for the
    package: the hint names the checkout, and works as printed; an installed package gets the plain one."""
    import shlex
    import shutil

    import hrm_deploy
    import hrm_deploy.errors as errors

    root = Path(hrm_deploy.__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file():  # this run: a source checkout
        argv = shlex.split(install_hint("rtx"))
        assert argv[:3] == ["pip", "install", "-e"] and argv[3] == f"{root}[rtx]"
    site = tmp_path / "site-packages" / "hrm_deploy"  # as pip installs it: no pyproject.toml beside it
    site.mkdir(parents=True)
    shutil.copy(errors.__file__, site / "errors.py")
    import importlib.util

    spec = importlib.util.spec_from_file_location("installed_errors", site / "errors.py")
    assert spec is not None and spec.loader is not None
    installed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(installed)
    assert installed.install_hint("rtx") == "pip install 'hrm-deploy[rtx]'"


def test_train_on_a_full_disk_is_one_line(full_disk, tmp_path):
    """torch.save reports a failed write as RuntimeError('... unexpected pos ...'): named as the full disk."""
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    data = tmp_path / "sudoku"
    generate_sudoku(SudokuSpec(train=16, test=4, blanks=(4, 8), seed=0), str(data))
    result = runner.invoke(
        app,
        ["train", "--data", str(data), "--out", str(full_disk / "run"), "--steps", "2", "--batch-size", "4"]
        + ["--device", "cpu", "--threads", "1"],
    )
    _one_line(result, "no space left")


def test_a_torch_write_failure_elsewhere_keeps_its_traceback(tmp_path):
    from hrm_deploy.io import naming_faults

    with pytest.raises(RuntimeError, match="shape mismatch"), naming_faults(tmp_path / "x.pt"):
        raise RuntimeError("shape mismatch")
