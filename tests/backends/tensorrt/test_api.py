"""The TensorRT / TensorRT-RTX backend's own pieces, with fake modules that record calls: the
timing-cache file key, the reproduce command (trtexec / tensorrt_rtx) and the TensorRT-RTX
runtime cache that contexts load and save beside the engine."""

from __future__ import annotations

import enum
import shlex
import types
from pathlib import Path

from hrm_deploy.backends.tensorrt.api import Backend, create_context, runtime_cache_path
from hrm_deploy.backends.tensorrt.builder.options import reproduce_command, timing_cache_path

SHAPES = {"inputs": [[1, 81], [8, 81], [16, 81]], "puzzle_identifiers": [[1], [8], [16]]}


def test_timing_cache_file_is_keyed_by_gpu_and_version():
    trt = types.SimpleNamespace(__version__="10.3.0.30")
    orin = timing_cache_path(
        "engines/timing.cache", Backend("tensorrt", trt), {"gpu": "Orin (nvgpu)", "compute_capability": "8.7"}
    )
    assert orin == Path("engines/timing.orin-nvgpu-sm87.tensorrt-10.3.0.30.cache")
    h100 = timing_cache_path(
        "engines/timing.cache", Backend("tensorrt", trt), {"gpu": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}
    )
    assert h100.name == "timing.nvidia-h100-80gb-hbm3-sm90.tensorrt-10.3.0.30.cache"
    newer = timing_cache_path(
        "engines/timing.cache",
        Backend("tensorrt", types.SimpleNamespace(__version__="10.3.1")),
        {"gpu": "Orin (nvgpu)", "compute_capability": "8.7"},
    )
    assert len({orin, h100, newer}) == 3


def test_reproduce_command_is_trtexec_or_tensorrt_rtx():
    common = {
        "onnx": "export/m.fp16.onnx",
        "engine": "engines/m.engine",
        "shapes": SHAPES,
        "workspace_mib": 1024,
        "optimization_level": 3,
    }
    trt10 = shlex.split(
        reproduce_command(
            Backend("tensorrt", types.SimpleNamespace(__version__="10.3.0")), timing_cache="engines/t.cache", **common
        )
    )
    assert trt10[0] == "trtexec" and "--onnx=export/m.fp16.onnx" in trt10 and "--saveEngine=engines/m.engine" in trt10
    assert (
        "--minShapes=inputs:1x81,puzzle_identifiers:1" in trt10
        and "--maxShapes=inputs:16x81,puzzle_identifiers:16" in trt10
    )
    assert {
        "--memPoolSize=workspace:1024M",
        "--stronglyTyped",
        "--builderOptimizationLevel=3",
        "--profilingVerbosity=detailed",
        "--timingCacheFile=engines/t.cache",
        "--skipInference",
    } <= set(trt10)
    trt11 = reproduce_command(Backend("tensorrt", types.SimpleNamespace(__version__="11.4.1")), **common)
    assert "--stronglyTyped" not in trt11  # a no-op on TensorRT 11
    rtx = shlex.split(
        reproduce_command(
            Backend("tensorrt-rtx", types.SimpleNamespace(__version__="1.7.1")),
            compute_capability="SM120",
            timing_cache="x",
            **common,
        )
    )
    assert rtx[0] == "tensorrt_rtx" and "--computeCapabilities=120" in rtx
    assert not any(a.startswith(("--timingCacheFile", "--stronglyTyped")) for a in rtx)
    portable = reproduce_command(Backend("tensorrt-rtx", types.SimpleNamespace(__version__="1.7.1")), **common)
    assert "--computeCapabilities" not in portable


class FakeRuntimeCache:
    def __init__(self, calls, accept):
        self.calls, self.accept, self.data = calls, accept, b""

    def deserialize(self, blob):
        self.calls.append(("deserialize", bytes(blob)))
        if self.accept:
            self.data = bytes(blob)
        return self.accept

    def serialize(self):
        self.calls.append(("serialize",))
        return self.data + b"+jit-kernels"


def fake_rtx(calls, accept=True):
    trt = types.SimpleNamespace(__version__="1.7.1.116")
    trt.ExecutionContextAllocationStrategy = enum.Enum(
        "ExecutionContextAllocationStrategy", "STATIC ON_PROFILE_CHANGE USER_MANAGED"
    )

    class RuntimeConfig:
        def create_runtime_cache(self):
            calls.append(("create_runtime_cache",))
            return FakeRuntimeCache(calls, accept)

        def set_runtime_cache(self, cache):
            calls.append(("set_runtime_cache", cache is not None))
            return True

        def set_execution_context_allocation_strategy(self, strategy):
            calls.append(("strategy", strategy.name))

    class Engine:
        def create_runtime_config(self):
            calls.append(("create_runtime_config",))
            return RuntimeConfig()

        def create_execution_context(self, *args):
            calls.append(("create_execution_context", *[type(a).__name__ for a in args]))
            return "context"

    return Backend("tensorrt-rtx", trt), Engine()


def test_rtx_runtime_cache_is_loaded_attached_and_saved_atomically(tmp_path):
    calls = []
    backend, engine = fake_rtx(calls)
    cache_file = runtime_cache_path(tmp_path / "m.engine")
    assert cache_file.name == "m.engine.runtime.cache"
    cache_file.write_bytes(b"kernels")
    handle = create_context(engine, backend, cache_file, allocation_strategy="user_managed")
    assert handle.context == "context" and handle.cache_loaded and not handle.notes
    assert calls == [
        ("create_runtime_config",),
        ("strategy", "USER_MANAGED"),
        ("create_runtime_cache",),
        ("deserialize", b"kernels"),
        ("set_runtime_cache", True),
        ("create_execution_context", "RuntimeConfig"),
    ]
    assert handle.save_runtime_cache() == cache_file
    assert cache_file.read_bytes() == b"kernels+jit-kernels"
    assert [p.name for p in tmp_path.iterdir()] == ["m.engine.runtime.cache"]  # no temp file left


def test_rtx_runtime_cache_from_another_machine_starts_empty(tmp_path, caplog):
    calls = []
    backend, engine = fake_rtx(calls, accept=False)
    cache_file = tmp_path / "m.engine.runtime.cache"
    cache_file.write_bytes(b"other-gpu")
    handle = create_context(engine, backend, cache_file)
    assert not handle.cache_loaded and "another GPU" in handle.notes[0]
    assert "another GPU" in caplog.text
    handle.save_runtime_cache()
    assert cache_file.read_bytes() == b"+jit-kernels"


def test_rtx_without_cache_file_and_tensorrt_without_runtime_config(tmp_path):
    calls = []
    backend, engine = fake_rtx(calls)
    handle = create_context(engine, backend, tmp_path / "new.runtime.cache")
    assert not handle.cache_loaded and ("deserialize", b"") not in calls
    handle.save_runtime_cache()
    assert (tmp_path / "new.runtime.cache").read_bytes() == b"+jit-kernels"
    plain = []
    _, trt_engine = fake_rtx(plain)
    handle = create_context(trt_engine, Backend("tensorrt", types.SimpleNamespace(__version__="10.3.0")))
    assert plain == [("create_execution_context",)] and handle.save_runtime_cache() is None


def test_rtx_graphs_use_its_whole_graph_capture_with_eager_kernels(tmp_path):
    calls = []
    backend, engine = fake_rtx(calls)
    backend.trt.DynamicShapesKernelSpecializationStrategy = enum.Enum("S", "LAZY EAGER NONE")
    backend.trt.CudaGraphStrategy = enum.Enum("G", "DISABLED WHOLE_GRAPH_CAPTURE")
    config_class = type(engine.create_runtime_config())
    config_class.cuda_graph_strategy = config_class.dynamic_shapes_kernel_specialization_strategy = None
    handle = create_context(engine, backend, None, cuda_graphs=True)
    assert handle.builtin_graphs
    config = handle.runtime_config
    assert config.dynamic_shapes_kernel_specialization_strategy.name == "EAGER"  # LAZY would capture fallbacks
    assert config.cuda_graph_strategy.name == "WHOLE_GRAPH_CAPTURE"
    old_backend, old_engine = fake_rtx([])  # a TensorRT-RTX without the strategies: no graphs, no error
    assert not create_context(old_engine, old_backend, None, cuda_graphs=True).builtin_graphs


def test_contexts_of_one_engine_share_one_runtime_cache_and_one_writer(tmp_path):
    calls = []
    backend, engine = fake_rtx(calls)
    cache_file = tmp_path / "m.engine.runtime.cache"
    first = create_context(engine, backend, cache_file)
    second = create_context(engine, backend, cache_file, shared=first)
    assert second.cache is first.cache and calls.count(("create_runtime_cache",)) == 1
    assert second.save_runtime_cache() is None  # not the owner
    assert first.save_runtime_cache() == cache_file and cache_file.read_bytes() == b"+jit-kernels"
    assert [p.name for p in tmp_path.iterdir()] == ["m.engine.runtime.cache"]  # no lock or temp file left
