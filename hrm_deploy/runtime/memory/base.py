"""What every memory backend shares: the dtype names and their host storage, and the
:class:`DeviceMemory` interface the device loop drives.

Dtypes are names (``float32 float16 bfloat16 int32 int64 bool``); numpy has no bfloat16, so bfloat16
lives in uint16 on the host and :func:`to_float32` widens it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

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


def nbytes(shape: tuple[int, ...], dtype: str) -> int:
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
