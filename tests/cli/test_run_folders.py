"""Every command that takes a checkpoint accepts a run folder (upstream's ``step_N`` files +
``all_config.yaml``) and hands the stage below its newest step file, resolved before any work
starts: the library function each command calls is replaced by one that records what it got."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from hrm_deploy.cli import app
from tests.conftest import write_upstream_run

runner = CliRunner()


class Called(Exception):
    """Raised by the stand-in for a stage: the arguments the command passed it."""

    def __init__(self, *args, **kwargs):
        super().__init__("called")
        self.args_, self.kwargs = args, kwargs


def _stand_in(*args, **kwargs):
    raise Called(*args, **kwargs)


@pytest.fixture
def run_folder(tmp_path, tiny_model, monkeypatch):
    """A run folder with step_100 and step_2000 (newest by number, not by name order)."""
    monkeypatch.chdir(tmp_path)
    write_upstream_run(tmp_path, tiny_model, step=100)
    newest = write_upstream_run(tmp_path, tiny_model, step=2000)
    return newest.parent, newest


def _called(args: list[str]) -> Called:
    result = runner.invoke(app, args)
    assert isinstance(result.exception, Called), result.output
    return result.exception


def test_export_gets_the_newest_step_file(run_folder, monkeypatch):
    folder, newest = run_folder
    monkeypatch.setattr("hrm_deploy.export.onnx_export.export_onnx", _stand_in)
    assert Path(_called(["export", str(folder)]).args_[0]) == newest


def test_build_engine_gets_the_newest_step_file(run_folder, monkeypatch):
    """The folder used to reach the torch builder, which compiled for a minute and then failed
    hashing it (IsADirectoryError)."""
    folder, newest = run_folder
    monkeypatch.setattr("hrm_deploy.engines.build.build_engine", _stand_in)
    assert Path(_called(["build-engine", str(folder), "--backend", "torch", "-q"]).args_[0]) == newest


@pytest.mark.parametrize("options", [["--backend", "tensorrt"], ["--backend", "tensorrt-rtx"], ["--target", "cpu"]])
def test_build_engine_from_onnx_backends_names_the_step_file_to_export(run_folder, monkeypatch, options):
    """Backends that build from ONNX resolve the folder too, and say in one line what to export
    (a checkpoint given to them used to end in a protobuf traceback)."""
    folder, newest = run_folder
    monkeypatch.setattr("hrm_deploy.engines.build.build_engine", _stand_in)
    result = runner.invoke(app, ["build-engine", str(folder), *options, "-q"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert f"{newest} is a checkpoint" in result.output and f"hrm-deploy export {newest}" in result.output


def test_verify_against_gets_the_newest_step_file(run_folder, monkeypatch):
    folder, newest = run_folder
    monkeypatch.setattr("hrm_deploy.verify.verify", _stand_in)
    assert Path(_called(["verify", "model.onnx", "--against", str(folder)]).kwargs["against"]) == newest


def test_bench_reference_gets_the_newest_step_file(run_folder, monkeypatch):
    folder, newest = run_folder
    monkeypatch.setattr("hrm_deploy.bench.run.bench", _stand_in)
    config = _called(["bench", "model.onnx", "--reference", str(folder)]).args_[1]
    assert Path(config.reference) == newest


def test_solve_gets_the_newest_step_file(run_folder, monkeypatch):
    folder, newest = run_folder
    monkeypatch.setattr("hrm_deploy.solve.solve", _stand_in)
    assert Path(_called(["solve", "." * 81, str(folder)]).args_[1]) == newest


def test_arc_eval_gets_the_newest_step_files(run_folder, monkeypatch, tmp_path):
    folder, newest = run_folder
    monkeypatch.setattr("hrm_deploy.arc.evaluate.arc_eval", _stand_in)
    called = _called(["arc-eval", str(folder), "--data", str(tmp_path / "arc"), "--against", str(folder)])
    assert Path(called.args_[0]) == newest and Path(called.kwargs["against"]) == newest


@pytest.mark.slow
def test_torch_engine_from_a_run_folder_for_real(run_folder, monkeypatch):
    """The user's command end to end on the CPU: it used to compile for a minute and then fail with
    IsADirectoryError hashing the folder. The compile itself is not the test (the PyTorch engine tests
    compile): AOTInductor is made to fail, so the build saves the exported program, hashes and publishes."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    import json

    monkeypatch.setattr(
        torch._inductor, "aoti_compile_and_package", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("skip"))
    )
    folder, newest = run_folder
    result = runner.invoke(app, ["build-engine", str(folder), "--backend", "torch", "-q"])
    assert result.exit_code == 0, result.output
    (engine,) = Path("engines").glob("*-step_2000.step.cpu.torch.pt2")  # named <run>-step_N, as exports are
    manifest = json.loads(engine.with_name(engine.name + ".manifest.json").read_text())
    assert Path(manifest["checkpoint"]["path"]) == newest and len(manifest["checkpoint"]["sha256"]) == 64
