"""The command line's choices: each Enum offers exactly what the library accepts, --help lists
the choices and shows flags as flags, and --precision and its short flags are one setting."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hrm_deploy.backends.ort.builder.options import CpuOptions
from hrm_deploy.cli import app, choices

runner = CliRunner()


def _library_choices() -> dict[type, set[str]]:
    from hrm_deploy.bench.run import BENCH_TARGETS
    from hrm_deploy.export.onnx_export import MODES
    from hrm_deploy.onnx_runtime import PROVIDERS
    from hrm_deploy.precision.calibrate import METHODS
    from hrm_deploy.puzzle_table import Placement
    from hrm_deploy.train.loop import OPTIMIZERS
    from hrm_deploy.train.presets import PRESETS
    from hrm_deploy.train.sinks import SINKS

    return {
        choices.CalibMethod: set(METHODS),
        choices.ExportMode: set(MODES),
        choices.PuzzleEmb: {p.value for p in Placement},
        choices.Provider: set(PROVIDERS),
        choices.BenchTarget: set(BENCH_TARGETS),
        choices.Preset: set(PRESETS),
        choices.Optimizer: set(OPTIMIZERS),
        choices.Sink: set(SINKS),
    }


def test_every_hand_kept_choice_enum_matches_the_library():
    for enum, accepted in _library_choices().items():
        assert {member.value for member in enum} == accepted, enum.__name__


def test_the_build_options_choices_match_the_library():
    """--cpu-int8 offers the recipes int8.py builds (its options class keeps a light copy)."""
    from hrm_deploy.backends.ort.builder.int8 import RECIPES
    from hrm_deploy.backends.ort.builder.options import INT8_RECIPES

    assert INT8_RECIPES == tuple(RECIPES)


def _help(*command: str, columns: int = 80) -> str:
    result = runner.invoke(app, [*command, "--help"], env={"NO_COLOR": "1", "COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    return result.output


COMMANDS = [[], ["export"], ["build-engine"], ["verify"], ["bench"], ["solve"], ["train"], ["serve"], ["triton-repo"]]
COMMANDS += [["data", "sudoku"], ["data", "maze"], ["inspect"], ["doctor"], ["profile"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "root")
def test_help_shows_flags_without_a_value_placeholder(command):
    text = _help(*command)  # 80 columns
    assert "<bool>" not in text and "BOOLEAN" not in text
    assert "…" not in text  # nothing cut short: option names and help words fit an 80-column terminal
    assert re.search(r"--help\s+Show this message", text)


def test_build_engine_help_lists_the_choices():
    text = _help("build-engine", columns=200)
    for listed in (
        "<fp16|bf16|int8|fp8|nvfp4|fp32>",
        "jetson-orin-8gb",
        "<tensorrt|tensorrt-rtx|torch>",
        "<minmax|entropy|percentile>",
    ):
        assert listed in text, listed
    assert re.search(r"--int8\s+Short for --precision int8", text)


@pytest.fixture
def built(monkeypatch):
    """build-engine with the library's build stage replaced: the EngineConfig each call passes."""
    from hrm_deploy.engines import build

    seen: list = []

    def fake_build(onnx, config, out, quiet=False, *args, **kwargs):
        seen.append(config)
        return build.EngineResult(Path("m.engine"), Path("m.engine.manifest.json"), Path("m.onnx"), {})

    monkeypatch.setattr(build, "build_engine", fake_build)

    def run(*args: str):
        result = runner.invoke(app, ["build-engine", "m.onnx", *args])
        assert result.exit_code == 0, result.output
        return seen[-1]

    return run


@pytest.mark.slow
def test_precision_option_and_short_flag_are_the_same_setting(built):
    assert built("--precision", "int8") == built("--int8")
    assert built("--precision", "int8", "--int8").precision == "int8"  # saying it twice is fine
    assert built("--precision", "bf16").precision == "bf16" and built("--fp32").precision == "fp32"
    assert built("--precision", "fp8") == built("--fp8")
    assert built("--precision", "nvfp4") == built("--nvfp4")


def test_precision_defaults_stay(built):
    assert built().precision == "fp16"
    assert built("--target", "cpu").precision == "fp32"
    assert built("--backend", "torch").precision == "fp32"
    assert built("--backend", "tensorrt").precision == "fp16"


@pytest.mark.parametrize(
    "args,named",
    [
        (["--precision", "int8", "--fp16"], "--precision int8 and --fp16"),
        (["--int8", "--fp16"], "--fp16 and --int8"),
    ],
)
def test_conflicting_precisions_are_one_line(args, named):
    result = runner.invoke(app, ["build-engine", "m.onnx", *args])
    assert result.exit_code == 2 and result.output.strip() == f"error: choose one precision, not {named}"


@pytest.mark.parametrize(
    "args,option",
    [
        (["build-engine", "m.onnx", "--precision", "fp4"], "--precision"),
        (["build-engine", "m.onnx", "--target", "jetson"], "--target"),
        (["train", "--data", "d", "--preset", "huge"], "--preset"),
        (["triton-repo", "m.onnx", "-o", "r", "--device", "tpu"], "--device"),
    ],
)
def test_an_invalid_choice_is_named_with_the_valid_ones(args, option):
    result = runner.invoke(app, args, env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert result.exit_code == 2 and "Traceback" not in result.output
    [line] = [line for line in result.output.splitlines() if "Invalid value" in line]
    assert f"'{option}'" in line and "is not one of" in line, result.output


def test_the_library_builds_the_cpu_target_like_the_cli(monkeypatch, tiny_onnx):
    """build_engine(EngineConfig(target="cpu", ...)) takes the cpu target's own path (static INT8 by
    default, options it cannot honour refused), not a dynamic-INT8 shortcut: its builder gets the
    FP32 export, not a precision graph."""
    from hrm_deploy.backends.ort.builder import target as cpu_target
    from hrm_deploy.engines import build
    from hrm_deploy.errors import ConfigError

    calls = []
    monkeypatch.setattr(cpu_target, "build_for_cpu", lambda request: calls.append(request) or "built")
    assert build.build_engine(tiny_onnx.unrolled, build.EngineConfig(precision="int8", target="cpu")) == "built"
    (request,) = calls
    assert request.config.options.int8_recipe is None and request.config.accuracy_check  # recipe None: static, checked
    assert request.ready == tiny_onnx.unrolled and request.backend == "ort"
    with pytest.raises(ConfigError, match="--cpu-int8 dynamic is an option of --target cpu"):
        build.EngineConfig(precision="int8", options=CpuOptions(int8_recipe="dynamic"))
