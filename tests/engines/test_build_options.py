"""Build options per backend: EngineConfig holds the fields every build reads plus one options object
of the building row's class; each class checks its own options, and an option given to a backend
that does not take it is one line written by the class that does."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from hrm_deploy.backends.ort.builder.options import CpuOptions
from hrm_deploy.backends.tensorrt.builder.options import TensorRTOptions
from hrm_deploy.backends.torch.builder.options import TorchOptions
from hrm_deploy.engines.build import EngineConfig
from hrm_deploy.engines.options import BuildOptions, every_class, options_class
from hrm_deploy.engines.request import Builder, builder
from hrm_deploy.errors import ConfigError, InternalError
from hrm_deploy.registry import BACKENDS, load

# every backend's options at their defaults, by field name (what the command line passes)
DEFAULTS = {f.name: f.default for cls in (CpuOptions, TensorRTOptions, TorchOptions) for f in fields(cls)}


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: TensorRTOptions(workspace_mib=8), "--workspace must be between 16 and"),
        (lambda: TensorRTOptions(optimization_level=6), "--opt-level must be between 0 and 5"),
        (lambda: CpuOptions(threads=-1), "--threads -1: give 1.."),
        (lambda: TorchOptions(device="gpu"), "device 'gpu': use auto, cpu, cuda or cuda:N"),
        (lambda: EngineConfig("fp16", backend="torch"), "the torch backend builds fp32 or bf16, not fp16"),
        (lambda: EngineConfig("fp8", target="cpu"), "fp8 engines need a GPU of compute capability >= 8.9"),
        (lambda: EngineConfig("fp32", target="cpu", options=CpuOptions(int8_recipe="dynamic")), "add --int8"),
    ],
)
def test_each_options_class_checks_its_own(make, message):
    with pytest.raises(ConfigError, match=message) as raised:
        make()
    assert "\n" not in str(raised.value)


def test_the_options_are_valid_at_their_ends():
    TensorRTOptions(workspace_mib=16, optimization_level=0, timing_cache=None)
    TorchOptions(device="cuda:1", tf32=True)
    CpuOptions(threads=1, fuse=False, int8_recipe="blockwise")


def test_each_building_row_names_its_options_class():
    assert options_class("desktop", None) is TensorRTOptions  # the target's first backend: TensorRT-RTX
    assert options_class("jetson-orin-8gb", "tensorrt") is TensorRTOptions
    assert options_class("cpu", None) is CpuOptions
    assert options_class("desktop", "torch") is TorchOptions
    for entry in BACKENDS.values():
        if entry.builder:  # a "module:Class" string, imported on first use like the builder
            assert entry.build_options and issubclass(load(entry.build_options), BuildOptions), entry.name
    assert every_class() == [CpuOptions, TensorRTOptions, TorchOptions]  # table order: refusals try them so


def test_left_out_options_are_the_building_rows_defaults():
    assert EngineConfig("fp16").options == TensorRTOptions()
    assert EngineConfig("int8", target="cpu").options == CpuOptions()
    assert EngineConfig("fp32", backend="torch").options == TorchOptions()
    config = EngineConfig("fp32", backend="torch", options=TorchOptions(device="cpu"))
    assert config.options_as(TorchOptions).device == "cpu"
    with pytest.raises(InternalError):
        config.options_as(CpuOptions)


def test_the_manifest_records_the_common_fields_and_the_backends_options_side_by_side():
    record = EngineConfig("fp16", max_batch=8, options=TensorRTOptions(allow_unrolled=True)).record()
    assert record["max_batch"] == 8 and record["allow_unrolled"] is True and record["precision"] == "fp16"
    assert "options" not in record and "tf32" not in record and "threads" not in record


@pytest.mark.parametrize(
    "make,message",
    [
        (
            lambda: EngineConfig("fp16", options=CpuOptions(threads=2)),
            "--threads 2 is an option of --target cpu; TensorRT does not take it",
        ),
        (
            lambda: EngineConfig("fp32", backend="torch", options=CpuOptions(fuse=False)),
            "--no-fuse is an option of --target cpu; --backend torch does not take it",  # not "the desktop target"
        ),
        (
            lambda: EngineConfig("fp16", options=TorchOptions(tf32=True)),
            "--tf32 is an option of --backend torch; drop it (TensorRT engines take their precision from the ONNX)",
        ),
        (
            lambda: EngineConfig("int8", target="cpu", options=TorchOptions(device="cpu")),
            "device='cpu' is an option of --backend torch; drop it",
        ),
        (
            lambda: EngineConfig("fp32", target="cpu", min_batch=2, options=TensorRTOptions(workspace_mib=64)),
            "--min-batch, --workspace: TensorRT build options; the cpu target runs any batch",
        ),
        (
            lambda: EngineConfig("fp32", backend="torch", opt_batch=4),
            "--opt-batch: TensorRT build option; --backend torch compiles for this machine and reads only --max-batch",
        ),
        (
            lambda: EngineConfig("fp32", target="cpu", options=TorchOptions()),
            "TorchOptions are the options of --backend torch; this build (--target cpu) takes CpuOptions",
        ),
    ],
)
def test_an_option_given_to_a_backend_that_does_not_take_it_is_one_line(make, message):
    with pytest.raises(ConfigError) as raised:
        make()
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_the_command_lines_values_go_to_the_building_rows_class():
    """from_values: every backend's options by name, unset ones at their defaults."""
    config = EngineConfig.from_values({**DEFAULTS, "threads": 2, "fuse": False}, precision="int8", target="cpu")
    assert config.options == CpuOptions(threads=2, fuse=False)
    config = EngineConfig.from_values({**DEFAULTS, "timing_cache": None}, precision="fp16", max_batch=8)
    assert config.options == TensorRTOptions(timing_cache=None) and config.max_batch == 8
    with pytest.raises(ConfigError, match="^--max-batch, --opt-level: TensorRT build options; the cpu target"):
        EngineConfig.from_values({**DEFAULTS, "optimization_level": 2}, precision="fp32", target="cpu", max_batch=8)
    with pytest.raises(ConfigError, match="^--tf32 is an option of --backend torch"):
        EngineConfig.from_values({**DEFAULTS, "tf32": True}, precision="fp16")
    with pytest.raises(InternalError, match="no backend's build options have a field 'nope'"):
        EngineConfig.from_values({"nope": 1}, precision="fp16")


def test_the_cli_refuses_another_backends_option_in_one_line():
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    run = CliRunner().invoke(app, ["build-engine", "m.onnx", "--threads", "2"])
    assert run.exit_code == 2 and "--threads 2 is an option of --target cpu" in run.output, run.output
    run = CliRunner().invoke(app, ["build-engine", "m.onnx", "--target", "cpu", "--workspace", "64"])
    assert run.exit_code == 2 and "--workspace: TensorRT build option" in run.output, run.output


def test_every_building_row_has_a_builder_of_the_one_protocol():
    for entry in BACKENDS.values():
        for backend in entry.builds_for:
            assert isinstance(builder(backend), Builder), backend
    with pytest.raises(ConfigError, match="no builder"):
        builder("nope")


def test_a_row_whose_builder_is_not_a_builder_is_a_bug(monkeypatch):
    from hrm_deploy import registry

    row = registry.BackendEntry("odd", "x:Y", (".odd",), "hrm_deploy.registry:BACKENDS", ("odd",))
    monkeypatch.setitem(registry.BACKENDS, "odd", row)
    with pytest.raises(InternalError, match="is not a Builder"):
        builder("odd")
    assert options_class("desktop", "odd") is BuildOptions  # no options of its own
    assert EngineConfig("fp32", backend="odd", max_batch=4).options == BuildOptions()


@pytest.mark.slow  # imports torch
def test_the_torch_builder_refuses_tf32_for_a_cpu_engine_before_any_work(tmp_path: Path):
    from hrm_deploy.engines.request import BuildRequest
    from hrm_deploy.engines.targets import get_target

    config = EngineConfig("fp32", backend="torch", options=TorchOptions(device="cpu", tf32=True))
    request = BuildRequest(config, get_target("desktop"), "torch", tmp_path / "e.pt2", True)
    with pytest.raises(ConfigError, match="--tf32 applies to CUDA engines"):
        builder("torch").preflight(request)
    found = builder("torch").preflight(
        BuildRequest(EngineConfig("fp32", backend="torch"), get_target("desktop"), "torch")
    )
    assert found.facts["device"] in ("cpu", "cuda")
