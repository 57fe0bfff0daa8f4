"""Device memory, one stream, events and graphs for the device loop, behind one small
interface with three implementations:

- :class:`TorchMemory`: torch tensors on ``cuda:N`` (or the CPU), a torch stream, torch CUDA graphs;
- :class:`CudaPythonMemory`: ``cudaMalloc``/``cudaMemcpyAsync``/stream capture through cuda-python
  (the light Jetson install, no torch);
- :class:`HostMemory`: numpy arrays, an emulated stream that records work while "capturing" (tests).

Every copy, launch and event of a runner goes through its one memory object and so runs on
its one stream: nothing is ordered against torch's *current* stream. Dtypes are names (``float32 float16 bfloat16 int32 int64 bool``); numpy has no bfloat16, so
bfloat16 lives in uint16 on the host and :func:`to_float32` widens it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import time
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import numpy as np

from hrm_deploy.errors import DependencyError, install_hint

DTYPES = ("float32", "float16", "bfloat16", "int32", "int64", "bool")
_HOST_STORAGE = {
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": np.uint16,
    "int32": np.int32,
    "int64": np.int64,
    "bool": np.bool_,
}


def host_dtype(dtype: str) -> np.dtype:
    """The numpy dtype that stores ``dtype`` on the host (bfloat16 -> its uint16 bits)."""
    return np.dtype(_HOST_STORAGE[dtype])


def to_float32(array: np.ndarray, dtype: str) -> np.ndarray:
    """A float32 copy of a host array of device dtype ``dtype`` (bfloat16 bits widened exactly)."""
    if dtype == "bfloat16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * host_dtype(dtype).itemsize


class DeviceMemory(Protocol):
    """What the device loop needs from a memory backend. Buffers are opaque to the loop."""

    kind: str  # "torch-cuda", "torch-cpu", "cuda-python", "host"
    stream_handle: int  # the raw stream an engine enqueues on (0 on CPU)
    capability: tuple[int, int] | None
    gpu_name: str | None
    supports_graphs: bool
    allocations: int  # device buffers allocated so far (the loop's tests count them)

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any: ...
    def staging(self, shape: tuple[int, ...], dtype: str) -> np.ndarray: ...
    def free_staging(self, host: np.ndarray) -> None: ...
    def ptr(self, buffer: Any) -> int: ...
    def rows(self, buffer: Any, start: int, stop: int) -> Any: ...
    def upload(self, dst: Any, host: np.ndarray) -> None: ...
    def download(self, host: np.ndarray, src: Any) -> None: ...
    def copy(self, dst: Any, src: Any) -> None: ...
    def new_event(self) -> Any: ...
    def record(self, event: Any) -> None: ...
    def elapsed_ms(self, start: Any, end: Any) -> float: ...
    def synchronize(self) -> None: ...
    def on_stream(self) -> contextlib.AbstractContextManager[Any]: ...
    def capture(self, work: Callable[[], None]) -> Any: ...
    def replay(self, graph: Any) -> None: ...
    def reset_peak(self) -> None: ...
    def peak_bytes(self) -> int: ...
    def free(self, buffer: Any) -> None: ...
    def close(self) -> None: ...


class TorchMemory:
    """Torch tensors on ``device`` ("cuda:N" or "cpu"), one stream on CUDA, pinned (async) staging."""

    def __init__(self, device: int | str = 0):
        import torch

        self.torch = torch
        self.device = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise DependencyError(
                "torch sees no CUDA GPU here (CPU-only torch, or no driver); "
                "use the cuda-python memory backend (--memory cuda-python) or a CUDA torch"
            )
        cuda = self.device.type == "cuda"
        self.kind = "torch-cuda" if cuda else "torch-cpu"
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self.stream_handle = int(self.stream.cuda_stream) if self.stream is not None else 0
        self.capability = torch.cuda.get_device_capability(self.device) if cuda else None
        self.gpu_name = torch.cuda.get_device_name(self.device) if cuda else None
        self.supports_graphs = cuda
        self.allocations = 0
        # id(host array) -> (that array: its id is not reused meanwhile, its pinned tensor); freed with the plan
        self._pinned: dict[int, tuple[np.ndarray, Any]] = {}
        self._peak = 0

    def _dtype(self, dtype: str) -> Any:
        return getattr(self.torch, dtype)

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        self.allocations += 1
        with self.on_stream():
            return self.torch.empty(shape, dtype=self._dtype(dtype), device=self.device)

    def staging(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        pin = self.device.type == "cuda"
        tensor = self.torch.empty(shape, dtype=self._dtype(dtype), pin_memory=pin)
        array = (tensor.view(self.torch.int16) if dtype == "bfloat16" else tensor).numpy()
        array = array.view(host_dtype(dtype))
        self._pinned[id(array)] = (array, tensor)
        return array

    def free_staging(self, host: np.ndarray) -> None:  # a released plan's staging array: unpinned
        self._pinned.pop(id(host), None)

    @staticmethod
    def ptr(buffer: Any) -> int:
        return int(buffer.data_ptr())

    @staticmethod
    def rows(buffer: Any, start: int, stop: int) -> Any:
        return buffer[start:stop]

    def _host_tensor(self, host: np.ndarray) -> Any:
        entry = self._pinned.get(id(host))
        if entry is None or entry[0] is not host:
            raise ValueError("host arrays given to TorchMemory must come from staging()")  # internal bug
        return entry[1]

    def upload(self, dst: Any, host: np.ndarray) -> None:
        with self.on_stream():
            dst.copy_(self._host_tensor(host), non_blocking=True)

    def download(self, host: np.ndarray, src: Any) -> None:
        with self.on_stream():
            self._host_tensor(host).copy_(src, non_blocking=True)

    def copy(self, dst: Any, src: Any) -> None:
        with self.on_stream():
            dst.copy_(src, non_blocking=True)

    def new_event(self) -> Any:
        return self.torch.cuda.Event(enable_timing=True) if self.stream is not None else [0.0]

    def record(self, event: Any) -> None:
        if self.stream is not None:
            event.record(self.stream)
        else:  # CPU: work is synchronous, the host clock is the stream's clock
            event[0] = time.perf_counter()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        if self.stream is not None:
            return float(start.elapsed_time(end))
        return (end[0] - start[0]) * 1e3

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.synchronize()

    def on_stream(self) -> contextlib.AbstractContextManager[Any]:
        """Make the runner's device and stream torch's current ones (for torch engines' kernels)."""
        if self.stream is None:
            return contextlib.nullcontext()
        stack = contextlib.ExitStack()
        stack.enter_context(self.torch.cuda.device(self.device))
        stack.enter_context(self.torch.cuda.stream(self.stream))
        return stack

    def capture(self, work: Callable[[], None]) -> Any:
        # thread-local capture mode: a server runs several threads, and the default ("global")
        # mode makes any unsafe CUDA call on *another* thread fail this capture
        torch = self.torch
        self.synchronize()
        with torch.cuda.device(self.device):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
                work()
        return graph

    def replay(self, graph: Any) -> None:
        with self.on_stream():
            graph.replay()

    def argmax(self, dst: Any, src: Any) -> None:
        """``dst`` (int32 [..]) = ``src`` (float [.., V]).argmax(-1), on the device: per-step answers
        cross to the host as 4 bytes per position instead of 4 x V."""
        with self.on_stream():
            dst.copy_(src.argmax(-1))

    def reset_peak(self) -> None:
        if self.stream is not None:
            self.torch.cuda.reset_peak_memory_stats(self.device)

    def peak_bytes(self) -> int:
        if self.stream is not None:
            return int(self.torch.cuda.max_memory_allocated(self.device))
        return 0

    def free(self, buffer: Any) -> None:
        """torch frees a tensor when the last reference goes."""

    def close(self) -> None:
        self._pinned.clear()


class _CudaBuffer:
    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: str, owner: bool = True):
        self.ptr, self.shape, self.dtype, self.owner = ptr, tuple(shape), dtype, owner

    @property
    def nbytes(self) -> int:
        return _nbytes(self.shape, self.dtype)

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
        size = max(_nbytes(shape, dtype), 1)
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
        row = _nbytes(buffer.shape[1:], buffer.dtype)
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


class HostMemory:
    """numpy "device" memory with an emulated stream: work runs at once, except while
    capturing, when it is recorded and only runs on replay (like a CUDA graph). Engines that
    enqueue work (the fake TensorRT of the tests) call :meth:`enqueue` via :meth:`from_handle`."""

    _streams: ClassVar[dict[int, HostMemory]] = {}
    _next: ClassVar[int] = 1

    def __init__(self) -> None:
        self.kind, self.supports_graphs = "host", True
        self.capability: tuple[int, int] | None = None
        self.gpu_name: str | None = None
        self.stream_handle = HostMemory._next
        HostMemory._next += 1
        HostMemory._streams[self.stream_handle] = self
        self.allocations, self.copies = 0, 0
        self._by_ptr: dict[int, np.ndarray] = {}
        self._recording: list[Callable[[], None]] | None = None
        self._live = self._peak = 0

    @classmethod
    def from_handle(cls, handle: int) -> HostMemory:
        return cls._streams[handle]

    def enqueue(self, work: Callable[[], None]) -> None:
        if self._recording is not None:
            self._recording.append(work)
        else:
            work()

    def empty(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        self.allocations += 1
        array = np.zeros(shape, host_dtype(dtype))
        self._by_ptr[array.ctypes.data] = array
        self._live += array.nbytes
        self._peak = max(self._peak, self._live)
        return array

    def staging(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        return np.zeros(shape, host_dtype(dtype))

    def free_staging(self, host: np.ndarray) -> None:  # plain arrays: freed with their last reference
        pass

    @staticmethod
    def ptr(buffer: np.ndarray) -> int:
        return int(buffer.ctypes.data)

    def array_at(self, ptr: int) -> np.ndarray:
        """The buffer allocated at ``ptr`` (how the fake engine reads its bindings)."""
        return self._by_ptr[ptr]

    @staticmethod
    def rows(buffer: np.ndarray, start: int, stop: int) -> np.ndarray:
        return buffer[start:stop]

    def _copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        def work() -> None:
            self.copies += 1
            np.copyto(dst, src.reshape(dst.shape))

        self.enqueue(work)

    upload = download = copy = _copy

    def argmax(self, dst: np.ndarray, src: np.ndarray) -> None:
        self.enqueue(lambda: np.copyto(dst, src.argmax(-1).reshape(dst.shape), casting="unsafe"))

    def new_event(self) -> list[float]:
        return [0.0]

    def record(self, event: list[float]) -> None:
        self.enqueue(lambda: event.__setitem__(0, time.perf_counter()))

    @staticmethod
    def elapsed_ms(start: list[float], end: list[float]) -> float:
        return (end[0] - start[0]) * 1e3

    def synchronize(self) -> None:  # work already ran
        pass

    def on_stream(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def capture(self, work: Callable[[], None]) -> list[Callable[[], None]]:
        self._recording = []
        try:
            work()
            return self._recording
        finally:
            self._recording = None

    def replay(self, graph: list[Callable[[], None]]) -> None:
        for item in graph:
            item()

    def reset_peak(self) -> None:
        self._peak = self._live

    def peak_bytes(self) -> int:
        return self._peak

    def free(self, buffer: np.ndarray) -> None:
        if self._by_ptr.pop(buffer.ctypes.data, None) is not None:
            self._live -= buffer.nbytes

    def close(self) -> None:
        HostMemory._streams.pop(self.stream_handle, None)


def device_memory(device: int | str = 0, prefer: str = "auto") -> DeviceMemory:
    """The memory backend for ``device``: ``"torch"``, ``"cuda-python"``, ``"host"`` or ``"auto"``
    (torch when it imports *and* sees CUDA, else cuda-python: a Jetson with a CPU-only torch
    still runs engines). ``device="cpu"`` gives torch CPU memory (CPU engines)."""
    if prefer not in ("auto", "torch", "cuda-python", "host"):
        raise DependencyError(f"memory backend {prefer!r} unknown; use auto, torch, cuda-python or host")
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
                raise DependencyError("torch is not installed; use the cuda-python memory backend") from None
        else:
            if prefer == "torch" or torch.cuda.is_available():
                return TorchMemory(index)
    return CudaPythonMemory(index)
