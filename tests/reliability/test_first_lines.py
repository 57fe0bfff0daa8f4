"""The first line names the real problem: a FIFO or device given as puzzles, a link loop given as
data, a bad HRM_DEPLOY_CACHE, a password in --url never echoed."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from hrm_deploy.errors import DataError, RemoteError, machine_fault


def test_solve_refuses_a_fifo_and_a_device_by_what_they_are(tmp_path):
    from hrm_deploy.solve import parse_puzzles

    fifo = tmp_path / "puzzles"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="is a FIFO"):
        parse_puzzles(str(fifo))  # never opened: reading it would wait for a writer
    with pytest.raises(DataError, match="/dev/zero is a character device, not a text file"):
        parse_puzzles("/dev/zero")


def test_data_through_a_link_loop_is_named_as_one(tmp_path):
    from hrm_deploy.data.examples import load_examples

    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(DataError, match="is a link that leads nowhere"):
        load_examples(loop, 8)


def test_a_fault_inside_hrm_deploy_cache_says_to_fix_that_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("HRM_DEPLOY_CACHE", str(tmp_path / "file" / "cache"))
    fault = machine_fault(OSError(errno.ENOTDIR, "Not a directory", str(tmp_path / "file" / "cache" / "datasets")))
    assert fault is not None and "point HRM_DEPLOY_CACHE" in str(fault) and "-o/--out" not in str(fault)
    elsewhere = machine_fault(OSError(errno.EROFS, "Read-only file system", str(tmp_path / "out.onnx")))
    assert elsewhere is not None and "-o/--out" in str(elsewhere)


def test_a_password_in_the_url_is_never_echoed():
    from hrm_deploy.serve.client import infer_remote, shown_url

    assert shown_url("http://user:secret@host:8000/x") == "http://user:***@host:8000/x"
    assert shown_url("user:secret@host:8000") == "user:***@host:8000"
    assert shown_url("http://host:8000") == "http://host:8000"
    pytest.importorskip("tritonclient.http", reason="the serve extra (tritonclient) is not installed")
    from tests.serve.helpers import free_ports

    (port,) = free_ports(1)
    feeds = {"inputs": np.zeros((1, 81), np.int32), "puzzle_identifiers": np.zeros(1, np.int32)}
    with pytest.raises(RemoteError) as error:
        infer_remote(f"http://user:secret@127.0.0.1:{port}", feeds, timeout_s=5)
    assert "secret" not in str(error.value) and "user:***@" in str(error.value)


def _copy(tiny_onnx, folder, name: str):
    import shutil
    from pathlib import Path

    src = Path(tiny_onnx.unrolled)
    dst = folder / name
    shutil.copy(src, dst)
    shutil.copy(src.with_name(src.name + ".manifest.json"), dst.with_name(dst.name + ".manifest.json"))
    return dst


def test_a_damaged_graph_or_manifest_is_named_before_asking_for_data(tiny_onnx, tmp_path):
    """verify/profile without --data used to say 'pass --data' for any of these."""
    from hrm_deploy.errors import ArtifactError
    from hrm_deploy.provenance import default_data

    edited = _copy(tiny_onnx, tmp_path, "edited.onnx")
    edited.write_bytes(edited.read_bytes()[:1000])
    with pytest.raises(ArtifactError, match="does not match its manifest"):
        default_data(edited, "--data")
    broken = _copy(tiny_onnx, tmp_path, "broken.onnx")
    broken.with_name("broken.onnx.manifest.json").write_text("{garbage")
    with pytest.raises(ArtifactError, match="is not valid JSON"):
        default_data(broken, "--data")
    bare = tmp_path / "bare.onnx"  # no manifest: nothing tells the data, but the graph is named first
    bare.write_bytes(edited.read_bytes())
    with pytest.raises(ArtifactError, match="bare.onnx is not a readable ONNX file"):
        default_data(bare, "--data")


def test_profile_batches_are_bounded_as_bench_batches_are():
    from hrm_deploy.bench.profile import ProfileConfig
    from hrm_deploy.errors import ConfigError

    with pytest.raises(ConfigError, match="--batch 100000 is too large; profiled batches go up to 4096"):
        ProfileConfig(batch=100000)


def test_bench_profile_of_a_truncated_graph_names_it(tiny_onnx, tmp_path):
    from hrm_deploy.bench.run import BenchConfig, bench
    from hrm_deploy.errors import ArtifactError

    bare = tmp_path / "bare.onnx"
    bare.write_bytes(tiny_onnx.unrolled.read_bytes()[:1000])
    config = BenchConfig(
        data=str(tiny_onnx.data),
        batches=(1,),
        iters=1,
        warmup=0,
        include_reference=False,
        profile=True,
        out_dir=str(tmp_path / "out"),
    )
    with pytest.raises(ArtifactError, match=r"nothing to profile: no artifact could be measured \(bare.onnx: skipped"):
        bench([str(bare)], config, quiet=True)


def test_data_out_onto_a_link_loop_is_one_line(tmp_path):
    from hrm_deploy.data.format import ensure_new_folder

    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(DataError, match="loop is a symbolic link"):
        ensure_new_folder(loop)


def test_a_dataset_with_float_arrays_holding_non_integers_is_refused(tmp_path):
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    root = tmp_path / "sudoku"
    generate_sudoku(SudokuSpec(train=4, test=4, blanks=(4, 8), seed=0), str(root))
    inputs_file = next((root / "test").glob("*__inputs.npy"))
    whole = np.load(inputs_file).astype(np.float64)
    np.save(inputs_file, whole)
    assert load_examples(root, 4, split="test").inputs.dtype == np.int32  # integral floats read as before
    whole[1, 3] = 2.5
    np.save(inputs_file, whole)
    with pytest.raises(DataError, match=r"'inputs' holds 2.5 at \[1, 3\]"):
        load_examples(root, 4, split="test")


def test_export_refuses_a_users_file_before_loading_the_model(tmp_path, monkeypatch):
    from hrm_deploy.cli.common import bundled_checkpoint
    from hrm_deploy.errors import ArtifactError
    from hrm_deploy.export import onnx_export

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before -o was checked")

    monkeypatch.setattr(onnx_export, "_resolve_source", loaded)
    mine = tmp_path / "mine.onnx"
    mine.write_text("my notes")
    with pytest.raises(ArtifactError, match="hrm-deploy replaces only its own"):
        onnx_export.export_onnx(bundled_checkpoint(), mine, quiet=True)
    assert mine.read_text() == "my notes"


def test_nvfp4_for_jetson_orin_names_the_missing_hardware_support(monkeypatch):
    """Before: the missing TensorRT package was named first (the machine could never run it anyway)."""
    from hrm_deploy.backends.tensorrt.builder import engine as trt_engine
    from hrm_deploy.engines.build import EngineConfig
    from hrm_deploy.engines.request import BuildRequest
    from hrm_deploy.engines.targets import get_target
    from hrm_deploy.errors import ConfigError, DependencyError

    def missing(name):
        raise DependencyError(f"the {name} backend needs the Python package tensorrt")

    monkeypatch.setattr(trt_engine, "load_backend", missing)
    request = BuildRequest(
        EngineConfig("nvfp4", target="jetson-orin-8gb", backend="tensorrt"), get_target("jetson-orin-8gb"), "tensorrt"
    )
    with pytest.raises(ConfigError, match=r"nvfp4 needs compute capability >= 10.0 \(Blackwell\); target jetson-orin"):
        trt_engine.TensorRTBuilder().preflight(request)


def test_a_pt2_program_fallback_given_alone_names_its_engine(tmp_path):
    from hrm_deploy.bench.run import BenchConfig, bench
    from hrm_deploy.errors import ArtifactError
    from hrm_deploy.manifest import write_manifest
    from hrm_deploy.verify import verify

    engine = tmp_path / "m.cpu.pt2"
    engine.write_bytes(b"package")
    program = tmp_path / "m.cpu.pt2.program"
    program.write_bytes(b"exported program")
    write_manifest(engine, stage="build", config={}, load_fallback=program.name, companions={program.name: "0" * 64})
    with pytest.raises(ArtifactError, match=r"m.cpu.pt2.program is a companion file of .*m.cpu.pt2 "):
        verify(program, tmp_path)
    with pytest.raises(ArtifactError, match=r"give .*m.cpu.pt2 itself"):
        bench([str(program)], BenchConfig(data=str(tmp_path), out_dir=str(tmp_path / "out")), quiet=True)


@pytest.mark.parametrize("command", ["verify", "bench", "inspect", "solve", "profile", "build-engine"])
def test_a_fifo_given_as_a_graph_is_named_as_a_fifo(tmp_path, command):
    """Not "does not exist or is not a file" (which a user reads as a wrong path), nor a question
    about the checkpoint it came from."""
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    fifo = tmp_path / "m.onnx"
    os.mkfifo(fifo)
    argv = {
        "verify": ["verify", str(fifo), "--data", str(tmp_path)],
        "bench": ["bench", str(fifo), "--data", str(tmp_path), "-o", str(tmp_path / "b")],
        "inspect": ["inspect", str(fifo)],
        "solve": ["solve", "0" * 81, str(fifo)],
        "profile": ["profile", str(fifo), "--data", str(tmp_path), "-o", str(tmp_path / "p")],
        "build-engine": ["build-engine", str(fifo), "--target", "cpu", "-o", str(tmp_path / "e.onnx")],
    }[command]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "FIFO" in result.output and "does not exist" not in result.output, result.output


def test_export_refuses_a_bad_loop_halting_rule_before_the_model_loads(monkeypatch, tmp_path):
    """It used to refuse only after loading the model and tracing it (6-8 s)."""
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the rule was checked")

    monkeypatch.setattr("hrm_deploy.export.onnx_export._resolve_source", no_load)
    result = CliRunner().invoke(app, ["export", "--mode", "loop", "--halt", "garbage", "-o", str(tmp_path / "m.onnx")])
    assert result.exit_code == 2 and "--halt 'garbage'" in result.output, result.output


def test_an_accuracy_budget_is_refused_where_no_build_applies_it():
    """--fp16 --accuracy-budget 3 was recorded in the manifest and never applied."""
    from hrm_deploy.engines.build import EngineConfig
    from hrm_deploy.errors import ConfigError

    for precision in ("fp16", "bf16", "fp32"):
        with pytest.raises(ConfigError, match=f"--accuracy-budget .*{precision} is not calibrated"):
            EngineConfig(precision, accuracy_budget=3.0)
    assert EngineConfig("int8", accuracy_budget=3.0).accuracy_budget == 3.0


@pytest.mark.parametrize("price", [float("inf"), float("nan"), -1.0])
def test_a_price_per_hour_must_be_a_finite_price(price):
    """inf wrote Infinity into report.json (not JSON)."""
    from hrm_deploy.arc.evaluate import ArcEvalConfig
    from hrm_deploy.errors import ConfigError

    with pytest.raises(ConfigError, match="--price-per-hour"):
        ArcEvalConfig(price_per_hour=price)


def test_a_price_of_minus_zero_is_zero():
    """-0 printed "cost -0.000000"."""
    import math

    from hrm_deploy.arc.evaluate import ArcEvalConfig

    price = ArcEvalConfig(price_per_hour=-0.0).price_per_hour
    assert price == 0.0 and math.copysign(1.0, price) == 1.0
