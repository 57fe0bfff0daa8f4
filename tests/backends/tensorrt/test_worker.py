"""The TensorRT build (worker) driven through a fake ``tensorrt`` module that records calls:
detailed profiling + inspector read with shapes set, the keyed timing cache and its bool; the
Jetson extra's pin and the CLI's timing-cache flag. The backend's own pieces (timing-cache key,
reproduce command, RTX runtime cache) are tested in tests/backends/tensorrt/test_api.py."""

from __future__ import annotations

import enum
import json
import sys
import types
from pathlib import Path

import pytest

from hrm_deploy.backends.tensorrt.builder import worker

ROOT = Path(__file__).resolve().parents[3]
SHAPES = {"inputs": [[1, 81], [8, 81], [16, 81]], "puzzle_identifiers": [[1], [8], [16]]}

DETAILED_JSON = json.dumps(
    {
        "Layers": [
            {
                "Name": "lm_head/MatMul",
                "LayerType": "CaskGemmMatrixMultiply",
                "Inputs": [{"Name": "h", "Dimensions": [8, 81, 64], "Format/Datatype": "Row major linear FP16 format"}],
                "Outputs": [
                    {"Name": "y", "Dimensions": [8, 81, 11], "Format/Datatype": "Row major linear FP16 format"}
                ],
            }
        ],
        "Bindings": ["inputs", "puzzle_identifiers", "logits"],
    }
)


class Calls(list):
    def add(self, *item):
        self.append(item)


def fake_tensorrt(
    calls: Calls, *, timing_cache_ok=(True,), engine_loads=True, version="10.3.0", progress_monitor=False
) -> types.ModuleType:
    """Enough of ``tensorrt`` for worker.build(); every call that matters is recorded in ``calls``.
    ``progress_monitor``: the module has ``IProgressMonitor`` and the build reports two phases to it."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.NetworkDefinitionCreationFlag = enum.IntEnum("NetworkDefinitionCreationFlag", {"STRONGLY_TYPED": 5})
    trt.MemoryPoolType = enum.Enum("MemoryPoolType", "WORKSPACE")
    trt.ProfilingVerbosity = enum.Enum("ProfilingVerbosity", "LAYER_NAMES_ONLY DETAILED NONE")
    trt.LayerInformationFormat = enum.Enum("LayerInformationFormat", "ONELINE JSON")
    trt.LayerType = enum.Enum("LayerType", "MATRIX_MULTIPLY QUANTIZE DEQUANTIZE")
    trt.BuilderFlag = enum.Enum("BuilderFlag", "REFIT STRIP_PLAN REFIT_IDENTICAL")
    answers = list(timing_cache_ok)

    class Logger:
        WARNING = 2

        def __init__(self, level):
            pass

    class Tensor:
        dtype = "DataType.HALF"

    class Layer:
        type = trt.LayerType.MATRIX_MULTIPLY
        num_outputs = 1

        def get_output(self, i):
            return Tensor()

    class Network:
        num_layers = 3

        def get_layer(self, i):
            return Layer()

    class TimingCache:
        def __init__(self, blob):
            self.blob = blob

        def serialize(self):
            return b"fresh-cache"

    class Config:
        profiling_verbosity = trt.ProfilingVerbosity.LAYER_NAMES_ONLY  # the documented default
        builder_optimization_level = 3

        def set_memory_pool_limit(self, pool, size):
            calls.add("workspace", size)

        def set_flag(self, flag):
            calls.add("flag", flag.name)

        def add_optimization_profile(self, profile):
            calls.add("profile", profile.shapes)

        def create_timing_cache(self, blob):
            calls.add("create_timing_cache", bytes(blob))
            return TimingCache(blob)

        def set_timing_cache(self, cache, ignore_mismatch):
            ok = answers.pop(0) if answers else True
            calls.add("set_timing_cache", cache.blob, ignore_mismatch, ok)
            return ok

    class Profile:
        def __init__(self):
            self.shapes = {}

        def set_shape(self, name, lo, opt, hi):
            self.shapes[name] = (lo, opt, hi)

    class Builder:
        def __init__(self, logger):
            pass

        def create_network(self, flags):
            return Network()

        def create_builder_config(self):
            self.config = Config()
            return self.config

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            calls.add("build", config.profiling_verbosity)
            monitor = getattr(config, "progress_monitor", None)
            if monitor is not None:  # as TensorRT does: nested phases, steps counted from 0
                monitor.phase_start("Building engine", None, 2)
                monitor.phase_start("Timing tactics", "Building engine", 3)
                monitor.step_complete("Timing tactics", 0)
                monitor.phase_finish("Timing tactics")
                monitor.step_complete("Building engine", 0)
                monitor.phase_finish("Building engine")
            return b"PLAN" * 10

    class OnnxParser:
        def __init__(self, network, logger):
            pass

        def parse_from_file(self, path):
            return True

    class Context:
        def set_input_shape(self, name, shape):
            calls.add("set_input_shape", name, list(shape))
            return True

    class Inspector:
        execution_context = None

        def get_engine_information(self, fmt):
            shapes = [c for c in calls if c[0] == "set_input_shape"]
            calls.add("inspect", fmt, self.execution_context is not None, len(shapes))
            return DETAILED_JSON if self.execution_context is not None else json.dumps({"Layers": ["lm_head/MatMul"]})

    class Engine:
        def create_execution_context(self):
            return Context()

        def create_engine_inspector(self):
            return Inspector()

    class Runtime:
        def __init__(self, logger):
            pass

        def deserialize_cuda_engine(self, plan):
            return Engine() if engine_loads else None

    class IProgressMonitor:
        def __init__(self):
            calls.add("monitor")

    for cls in (Logger, Builder, OnnxParser, Runtime) + ((IProgressMonitor,) if progress_monitor else ()):
        setattr(trt, cls.__name__, cls)
    return trt


def worker_spec(tmp_path, timing_cache=None) -> dict:
    """A build spec as build.py writes it for the worker (engine, result and layers under tmp_path)."""
    return {
        "backend": "tensorrt",
        "onnx": "m.onnx",
        "shapes": SHAPES,
        "workspace_mib": 64,
        "optimization_level": 3,
        "compute_capability": None,
        "timing_cache": timing_cache,
        "out": str(tmp_path / "m.engine"),
        "result": str(tmp_path / "result.json"),
        "layers_out": str(tmp_path / "layers.json"),
    }


def run_worker(tmp_path, monkeypatch, trt, timing_cache=None, **extra):
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    spec = {**worker_spec(tmp_path, timing_cache), **extra}
    assert worker.build(spec) == 0
    return json.loads((tmp_path / "result.json").read_text())


def test_builder_asks_for_detailed_layers_and_reads_them_with_shapes_set(tmp_path, monkeypatch):
    calls = Calls()
    result = run_worker(tmp_path, monkeypatch, fake_tensorrt(calls))
    assert ("build", sys.modules["tensorrt"].ProfilingVerbosity.DETAILED) in calls
    # every input set to the profile's opt shape before the inspector is read through that context
    assert [c for c in calls if c[0] == "set_input_shape"] == [
        ("set_input_shape", "inputs", [8, 81]),
        ("set_input_shape", "puzzle_identifiers", [8]),
    ]
    inspect = next(c for c in calls if c[0] == "inspect")
    assert inspect[2] is True and inspect[3] == 2
    inspection = result["engine_inspection"]
    assert inspection["available"] and inspection["shapes_set"]
    assert inspection["summary"]["dtypes"] == {"fp16": 2}
    assert json.loads((tmp_path / "layers.json").read_text()) == json.loads(DETAILED_JSON)


def test_no_gpu_means_no_layers_file(tmp_path, monkeypatch):
    result = run_worker(tmp_path, monkeypatch, fake_tensorrt(Calls(), engine_loads=False))
    assert result["engine_inspection"] == {
        "available": False,
        "reason": "the engine does not load on this machine (no suitable GPU)",
    }
    assert not (tmp_path / "layers.json").exists()


def test_stale_timing_cache_is_dropped_said_and_rewritten_atomically(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"from-another-gpu")
    calls = Calls()
    result = run_worker(tmp_path, monkeypatch, fake_tensorrt(calls, timing_cache_ok=(False, True)), str(cache))
    sets = [c for c in calls if c[0] == "set_timing_cache"]
    assert sets == [("set_timing_cache", b"from-another-gpu", False, False), ("set_timing_cache", b"", False, True)]
    assert "does not match this GPU" in capsys.readouterr().err
    assert result["timing_cache"]["stale_dropped"] and "does not match" in result["warnings"][0]
    assert cache.read_bytes() == b"fresh-cache"
    assert not list(tmp_path.glob(".timing.cache.*"))  # no temp file left behind


def test_matching_timing_cache_is_loaded(tmp_path, monkeypatch):
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"same-gpu")
    result = run_worker(tmp_path, monkeypatch, fake_tensorrt(Calls()), str(cache))
    assert result["timing_cache"] == {"used": True, "path": str(cache), "loaded_bytes": 8}


def test_strip_weights_sets_strip_plan_and_refit_identical(tmp_path, monkeypatch):
    calls = Calls()
    result = run_worker(tmp_path, monkeypatch, fake_tensorrt(calls), strip_weights=True)
    assert [c[1] for c in calls if c[0] == "flag"] == ["STRIP_PLAN", "REFIT_IDENTICAL"]
    assert result["weights_stripped"] is True
    plain = Calls()
    assert "weights_stripped" not in run_worker(tmp_path, monkeypatch, fake_tensorrt(plain))
    assert not [c for c in plain if c[0] == "flag"]


@pytest.mark.parametrize(
    "flag,expected",
    [
        ([], "engines/timing.cache"),
        (["--timing-cache", "/tmp/t.cache"], "/tmp/t.cache"),
        (["--timing-cache", "none"], None),
    ],
)
def test_build_engine_cli_passes_the_timing_cache(monkeypatch, flag, expected):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app
    from hrm_deploy.engines import build

    seen = {}

    def fake_build(onnx, config, out, quiet=False):
        seen["config"] = config
        return build.EngineResult(Path("m.engine"), Path("m.engine.manifest.json"), Path("m.onnx"), {})

    monkeypatch.setattr(build, "build_engine", fake_build)
    run = CliRunner().invoke(app, ["build-engine", "m.onnx", *flag])
    assert run.exit_code == 0, run.output
    assert seen["config"].options.timing_cache == expected
