"""cuda-python memory: ``cudaMalloc``/``cudaMemcpyAsync``/stream capture without torch (the light
Jetson install)."""

from __future__ import annotations

import contextlib
import ctypes
import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

from hrm_deploy.errors import DependencyError, install_hint
from hrm_deploy.runtime.memory.base import host_dtype, nbytes


class _CudaBuffer:
    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: str, owner: bool = True):
        self.ptr, self.shape, self.dtype, self.owner = ptr, tuple(shape), dtype, owner

    @property
    def nbytes(self) -> int:
        return nbytes(self.shape, self.dtype)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Lets torch (the PyTorch engine's adapter) view the buffer without a copy. bfloat16 has no
        type string: it is shown as int16 (its bits), which the viewer reinterprets (``.view``)."""
        typestr = "<i2" if self.dtype == "bfloat16" else host_dtype(self.dtype).str
        return {"shape": self.shape, "typestr": typestr, "data": (self.ptr, False), "version": 3}


class CudaPythonMemory:
    """Buffers from ``cudaMalloc`` through cuda-python (``cuda.bindings.runtime`` or ``cuda.cudart``);
    a non-blocking stream; pinned staging from ``cudaMallocHost``; graphs by stream capture."""

    def __init__(self, device: int = 0):
        try:
            self.rt: Any = importlib.import_module("cuda.bindings.runtime")
        except ImportError:
            try:
                self.rt = importlib.import_module("cuda.cudart")
            except ImportError:
                raise DependencyError(
                    "the light TensorRT runtime needs cuda-python for device memory: "
                    f"{install_hint('jetson')} (or install a CUDA torch)"
                ) from None
        rt = self.rt
        self.device_index = device
        self._check(rt.cudaSetDevice(device))
        self._stream = self._check(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking))
        self.stream_handle = _handle(self._stream)
        props = self._check(rt.cudaGetDeviceProperties(device))
        self.capability: tuple[int, int] | None = (int(props.major), int(props.minor))
        name = props.name
        self.gpu_name: str | None = (
            name.decode(errors="replace").rstrip("\x00") if isinstance(name, bytes) else str(name)
        )
        self.kind, self.supports_graphs, self.allocations = "cuda-python", True, 0
        self._live = self._peak = 0
        self._host_buffers: list[int] = []

    def _check(self, result: Any) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            raise DependencyError(f"CUDA call failed with {err}; is the GPU visible and the driver loaded?")
        return rest[0] if len(rest) == 1 else (rest or None)

    def empty(self, shape: tuple[int, ...], dtype: str) -> _CudaBuffer:
        buffer = _CudaBuffer(0, shape, dtype)
        buffer.ptr = int(self._check(self.rt.cudaMalloc(max(buffer.nbytes, 1))))
        self.allocations += 1
        self._live += buffer.nbytes
        self._peak = max(self._peak, self._live)
        return buffer

    def staging(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        size = max(nbytes(shape, dtype), 1)
        ptr = int(self._check(self.rt.cudaMallocHost(size)))
        self._host_buffers.append(ptr)
        raw = (ctypes.c_byte * size).from_address(ptr)
        return np.frombuffer(
            memoryview(raw), dtype=host_dtype(dtype), count=int(np.prod(shape, dtype=np.int64))
        ).reshape(shape)

    @staticmethod
    def ptr(buffer: _CudaBuffer) -> int:
        return buffer.ptr

    @staticmethod
    def rows(buffer: _CudaBuffer, start: int, stop: int) -> _CudaBuffer:
        row = nbytes(buffer.shape[1:], buffer.dtype)
        return _CudaBuffer(buffer.ptr + start * row, (stop - start, *buffer.shape[1:]), buffer.dtype, owner=False)

    def _memcpy(self, dst: int, src: int, nbytes: int, kind: Any) -> None:
        self._check(self.rt.cudaMemcpyAsync(dst, src, nbytes, kind, self._stream))

    def upload(self, dst: _CudaBuffer, host: np.ndarray) -> None:
        self._memcpy(dst.ptr, host.ctypes.data, dst.nbytes, self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice)

    def download(self, host: np.ndarray, src: _CudaBuffer) -> None:
        self._memcpy(host.ctypes.data, src.ptr, src.nbytes, self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost)

    def copy(self, dst: _CudaBuffer, src: _CudaBuffer) -> None:
        self._memcpy(dst.ptr, src.ptr, src.nbytes, self.rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice)

    def new_event(self) -> Any:
        return self._check(self.rt.cudaEventCreate())

    def record(self, event: Any) -> None:
        self._check(self.rt.cudaEventRecord(event, self._stream))

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self._check(self.rt.cudaEventElapsedTime(start, end)))

    def synchronize(self) -> None:
        self._check(self.rt.cudaStreamSynchronize(self._stream))

    def on_stream(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def capture(self, work: Callable[[], None]) -> Any:
        rt = self.rt
        # thread-local mode: unsafe calls on other threads (a server's) do not invalidate this capture
        mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        self._check(rt.cudaStreamBeginCapture(self._stream, mode))
        try:
            work()
        finally:
            graph = self._check(rt.cudaStreamEndCapture(self._stream))
        return self._check(rt.cudaGraphInstantiate(graph, 0))

    def replay(self, graph: Any) -> None:
        self._check(self.rt.cudaGraphLaunch(graph, self._stream))

    def reset_peak(self) -> None:
        self._peak = self._live

    def peak_bytes(self) -> int:
        return self._peak

    def free_staging(self, host: np.ndarray) -> None:
        if (ptr := int(host.ctypes.data)) in self._host_buffers:  # a staging array: its cudaMallocHost buffer
            self._host_buffers.remove(ptr)
            self.rt.cudaFreeHost(ptr)

    def free(self, buffer: _CudaBuffer) -> None:
        if buffer.owner and buffer.ptr:
            self.rt.cudaFree(buffer.ptr)
            self._live -= buffer.nbytes
            buffer.ptr = 0

    def close(self) -> None:
        """Free the pinned staging buffers and the stream (device buffers: :meth:`free`)."""
        for ptr in self._host_buffers:
            self.rt.cudaFreeHost(ptr)
        self._host_buffers.clear()
        if self._stream is not None:
            self.rt.cudaStreamDestroy(self._stream)
            self._stream = None


def _handle(stream: Any) -> int:
    get = getattr(stream, "getPtr", None)
    return int(get()) if get is not None else int(stream)
