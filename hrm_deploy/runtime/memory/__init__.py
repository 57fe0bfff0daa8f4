"""Device memory, one stream, events and graphs for the device loop, behind one small
interface (:class:`~hrm_deploy.runtime.memory.base.DeviceMemory`) with one module per backend:

- :mod:`~hrm_deploy.runtime.memory.torch_memory`: :class:`TorchMemory`, torch tensors on ``cuda:N``
  (or the CPU), a torch stream, torch CUDA graphs;
- :mod:`~hrm_deploy.runtime.memory.cuda_python`: :class:`CudaPythonMemory`, ``cudaMalloc``/
  ``cudaMemcpyAsync``/stream capture through cuda-python (the light Jetson install, no torch);
- :mod:`~hrm_deploy.runtime.memory.host`: :class:`HostMemory`, numpy arrays, an emulated stream that
  records work while "capturing" (tests).

Every copy, launch and event of a runner goes through its one memory object and so runs on its one
stream: nothing is ordered against torch's *current* stream. :func:`device_memory` picks the
backend; none of the modules imports torch or cuda-python until its backend is made.
"""

from __future__ import annotations

import importlib

from hrm_deploy.errors import DependencyError
from hrm_deploy.runtime.memory.base import DTYPES, DeviceMemory, host_dtype, to_float32
from hrm_deploy.runtime.memory.cuda_python import CudaPythonMemory
from hrm_deploy.runtime.memory.host import HostMemory
from hrm_deploy.runtime.memory.torch_memory import TorchMemory

__all__ = [
    "DTYPES",
    "CudaPythonMemory",
    "DeviceMemory",
    "HostMemory",
    "TorchMemory",
    "device_memory",
    "host_dtype",
    "to_float32",
]


def device_memory(device: int | str = 0, prefer: str = "auto") -> DeviceMemory:
    """The memory backend for ``device``: ``"torch"``, ``"cuda-python"``, ``"host"`` or ``"auto"``
    (torch when it imports *and* sees CUDA, else cuda-python: a Jetson with a CPU-only torch
    still runs engines). ``device="cpu"`` gives torch CPU memory (CPU engines)."""
    if prefer not in ("auto", "torch", "cuda-python", "host"):
        raise DependencyError(f"memory={prefer!r}: unknown memory backend; use auto, torch, cuda-python or host")
    if prefer == "host":
        return HostMemory()
    if device == "cpu":
        return TorchMemory("cpu")
    index = int(str(device).removeprefix("cuda:")) if isinstance(device, str) else device
    if prefer in ("auto", "torch"):
        try:
            torch = importlib.import_module("torch")
        except ImportError:
            if prefer == "torch":
                raise DependencyError(
                    "torch is not installed; open the runner with memory='cuda-python' (or 'auto')"
                ) from None
        else:
            if prefer == "torch" or torch.cuda.is_available():
                return TorchMemory(index)
    return CudaPythonMemory(index)
