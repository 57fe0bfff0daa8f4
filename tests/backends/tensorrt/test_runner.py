"""The TensorRT runner is light: numpy + TensorRT only (checked with torch and onnx blocked)."""

import subprocess
import sys

import pytest

from hrm_deploy.errors import EngineError
from hrm_deploy.runtime.compat import check_compatible

BLOCKED_IMPORT = """
import sys
for name in ("torch", "onnx", "onnxruntime"):
    sys.modules[name] = None  # any import of them now raises ImportError
import hrm_deploy.backends.tensorrt.runner, hrm_deploy.runtime.memory, hrm_deploy.runtime.device_loop, hrm_deploy.runtime.adapter, hrm_deploy.backends.tensorrt.adapter
import hrm_deploy.runtime.base, hrm_deploy.bench.run, hrm_deploy.bench.jetson
import hrm_deploy.backends, hrm_deploy.data.examples, hrm_deploy.precision.accuracy, hrm_deploy.verify
from hrm_deploy.errors import DependencyError
from hrm_deploy.runtime.memory import device_memory
try:
    device_memory(0)
except DependencyError as exc:
    print("MEMORY:", exc)
loaded = sorted(m for m in ("torch", "onnx", "onnxruntime") if sys.modules.get(m) is not None)
print("LOADED:", loaded)
"""


def test_light_runtime_imports_without_torch_and_onnx():
    run = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "LOADED: []" in run.stdout
    # without torch, device memory comes from cuda-python (or a GPU error where it is installed)
    assert "MEMORY:" in run.stdout and ("cuda-python" in run.stdout or "GPU" in run.stdout)


MANIFEST = {
    "backend": {"name": "tensorrt", "version": "10.3.0.30"},
    "compute_capability": None,
    "build_machine": {"gpu": "Orin", "compute_capability": "8.7"},
}


def test_engine_manifest_mismatch_names_both_sides():
    check_compatible(MANIFEST, "tensorrt", "10.3.0.26", (8, 7), "Orin")  # same major.minor, same GPU
    with pytest.raises(EngineError, match="10.3.0.30 but 10.7.0"):
        check_compatible(MANIFEST, "tensorrt", "10.7.0", (8, 7), "Orin")
    with pytest.raises(EngineError, match="8.7 .*9.0"):
        check_compatible(MANIFEST, "tensorrt", "10.3.0", (9, 0), "H100")
    with pytest.raises(EngineError, match="built with tensorrt but tensorrt-rtx"):
        check_compatible(MANIFEST, "tensorrt-rtx", "1.7.1", None, None)
    rtx = {"backend": {"name": "tensorrt-rtx", "version": "1.7.1.116"}, "compute_capability": "SM120"}
    check_compatible(rtx, "tensorrt-rtx", "1.7.1.116", (12, 0), "RTX 5090")
    with pytest.raises(EngineError, match="--compute-capability SM89"):
        check_compatible(rtx, "tensorrt-rtx", "1.7.1.116", (8, 9), "RTX 4090")


def test_adapter_surface_exists_in_installed_tensorrt_rtx():
    """Every TensorRT attribute the adapter uses exists in the installed tensorrt_rtx (no GPU needed)."""
    trt = pytest.importorskip("tensorrt_rtx", reason="tensorrt-rtx is not installed (pip install 'hrm-deploy[rtx]')")
    if not hasattr(trt, "Builder"):
        pytest.skip("tensorrt_rtx here is type stubs only; pip install tensorrt-rtx for the real package")
    from hrm_deploy.backends.tensorrt.adapter import TRT_DTYPES

    assert set(TRT_DTYPES) <= set(trt.DataType.__members__)
    assert {"INPUT", "OUTPUT"} <= set(trt.TensorIOMode.__members__)
    assert "USER_MANAGED" in trt.ExecutionContextAllocationStrategy.__members__
    for name in (
        "num_io_tensors",
        "get_tensor_name",
        "get_tensor_mode",
        "get_tensor_dtype",
        "get_tensor_shape",
        "get_tensor_profile_shape",
        "create_execution_context",
        "create_runtime_config",
        "device_memory_size_v2",
    ):
        assert hasattr(trt.ICudaEngine, name), name
    for name in (
        "set_input_shape",
        "get_tensor_shape",
        "set_tensor_address",
        "execute_async_v3",
        "set_device_memory",
        "update_device_memory_size_for_shapes",
        "is_stream_capturable",
    ):
        assert hasattr(trt.IExecutionContext, name), name
    assert hasattr(trt.IRuntimeConfig, "set_execution_context_allocation_strategy")


def test_tensorrt_rtxs_own_refusal_to_load_an_engine_is_one_line(tmp_path):
    """The real TensorRT-RTX (no GPU needed to refuse): its reason comes through the runner's logger."""
    trt = pytest.importorskip("tensorrt_rtx", reason="tensorrt-rtx is not installed (pip install 'hrm-deploy[rtx]')")
    if not hasattr(trt, "Builder"):
        pytest.skip("tensorrt_rtx here is type stubs only; pip install tensorrt-rtx for the real package")
    from hrm_deploy.backends.tensorrt.api import deserialize, load_backend, recording_logger

    backend = load_backend("tensorrt-rtx")
    logger = recording_logger(trt)
    with pytest.raises(EngineError, match=r"cannot load m\.engine: .*Error Code"):
        deserialize(backend, trt.Runtime(logger), logger, b"not an engine", "m.engine")
