"""Host memory: numpy arrays and an emulated stream that records work while "capturing" (the tests'
fake TensorRT runs on it)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from hrm_deploy.runtime.memory.base import host_dtype


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
