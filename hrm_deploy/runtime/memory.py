"""Device memory and streams for the engine runtime, from torch when it is installed (and
already holds the CUDA context) or from cuda-python otherwise (the light Jetson install)."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np

from hrm_deploy.errors import DependencyError


class TorchMemory:
    """Buffers are torch CUDA tensors; the stream is a torch stream."""

    def __init__(self, device: int):
        import torch

        if not torch.cuda.is_available():
            raise DependencyError("the TensorRT runtime needs an NVIDIA GPU; torch sees none here")
        self.torch, self.device = torch, torch.device("cuda", device)
        self.stream = torch.cuda.Stream(self.device)
        self.handle = self.stream.cuda_stream
        self.capability = torch.cuda.get_device_capability(device)
        self.gpu_name = torch.cuda.get_device_name(device)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        return self.torch.empty(shape, dtype=getattr(self.torch, np.dtype(dtype).name), device=self.device)

    def upload(self, array: np.ndarray) -> Any:
        return self.torch.from_numpy(np.ascontiguousarray(array)).to(self.device, non_blocking=True)

    @staticmethod
    def ptr(buffer: Any) -> int:
        return int(buffer.data_ptr())

    def download(self, buffer: Any) -> np.ndarray:
        self.synchronize()
        return buffer.cpu().numpy()

    def synchronize(self) -> None:
        self.stream.synchronize()

    def release(self) -> None:
        """Buffers are freed by torch's allocator when no longer referenced."""

    def mark(self) -> Any:
        """A CUDA event recorded on the stream now (for timing phases without a host sync)."""
        event = self.torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return event

    @staticmethod
    def elapsed_ms(start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))


class _CudaBuffer:
    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype):
        self.ptr, self.shape, self.dtype = ptr, shape, np.dtype(dtype)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize


class CudaPythonMemory:
    """Buffers from cudaMalloc through cuda-python (``cuda.bindings.runtime`` or ``cuda.cudart``)."""

    def __init__(self, device: int):
        try:
            self.rt = importlib.import_module("cuda.bindings.runtime")
        except ImportError:
            try:
                self.rt = importlib.import_module("cuda.cudart")
            except ImportError:
                raise DependencyError("the light TensorRT runtime needs cuda-python for device memory: "
                                      "pip install 'hrm-deploy[jetson]' (or install torch)") from None
        self._check(self.rt.cudaSetDevice(device))
        self.handle = self._check(self.rt.cudaStreamCreate())
        props = self._check(self.rt.cudaGetDeviceProperties(device))
        self.capability = (props.major, props.minor)
        self.gpu_name = props.name.decode(errors="replace").rstrip("\x00") if isinstance(props.name, bytes) else str(props.name)
        self._buffers: list[_CudaBuffer] = []
        self._events: list[Any] = []

    def _check(self, result: Any) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise DependencyError(f"CUDA call failed with {err}; is the GPU visible and the driver loaded?")
        return rest[0] if len(rest) == 1 else (rest or None)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> _CudaBuffer:
        buffer = _CudaBuffer(0, shape, dtype)
        buffer.ptr = int(self._check(self.rt.cudaMalloc(max(buffer.nbytes, 1))))
        self._buffers.append(buffer)
        return buffer

    def upload(self, array: np.ndarray) -> _CudaBuffer:
        array = np.ascontiguousarray(array)
        buffer = self.empty(array.shape, array.dtype)
        self._check(self.rt.cudaMemcpyAsync(buffer.ptr, array.ctypes.data, buffer.nbytes,
                                            self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice, self.handle))
        self.synchronize()  # the host array may go away after this call
        return buffer

    @staticmethod
    def ptr(buffer: _CudaBuffer) -> int:
        return buffer.ptr

    def download(self, buffer: _CudaBuffer) -> np.ndarray:
        out = np.empty(buffer.shape, buffer.dtype)
        self._check(self.rt.cudaMemcpyAsync(out.ctypes.data, buffer.ptr, buffer.nbytes,
                                            self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.handle))
        self.synchronize()
        return out

    def synchronize(self) -> None:
        self._check(self.rt.cudaStreamSynchronize(self.handle))

    def mark(self) -> Any:
        event = self._check(self.rt.cudaEventCreate())
        self._check(self.rt.cudaEventRecord(event, self.handle))
        self._events.append(event)
        return event

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self._check(self.rt.cudaEventElapsedTime(start, end)))

    def release(self) -> None:
        """Free every buffer and event of the last call (results are host copies by then)."""
        for event in self._events:
            self.rt.cudaEventDestroy(event)
        self._events.clear()
        for buffer in self._buffers:
            self.rt.cudaFree(buffer.ptr)
        self._buffers.clear()


def device_memory(device: int = 0, prefer: str = "auto") -> TorchMemory | CudaPythonMemory:
    """torch when importable (and ``prefer`` allows), else cuda-python."""
    if prefer in ("auto", "torch"):
        try:
            importlib.import_module("torch")
            return TorchMemory(device)
        except ImportError:
            if prefer == "torch":
                raise DependencyError("torch is not installed; use the cuda-python memory backend") from None
    return CudaPythonMemory(device)
