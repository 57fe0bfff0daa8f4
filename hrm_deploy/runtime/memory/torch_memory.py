"""Torch memory: tensors on ``cuda:N`` (or the CPU), one torch stream, torch CUDA graphs, pinned staging."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from hrm_deploy.errors import DependencyError, InternalError
from hrm_deploy.runtime.memory.base import host_dtype


class TorchMemory:
    """Torch tensors on ``device`` ("cuda:N" or "cpu"), one stream on CUDA, pinned (async) staging."""

    def __init__(self, device: int | str = 0):
        import torch

        self.torch = torch
        self.device = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise DependencyError(
                "torch sees no CUDA GPU here (CPU-only torch, or no driver); "
                "open the runner with memory='cuda-python' (or 'auto', which picks it) or install a CUDA torch"
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
            raise InternalError("host arrays given to TorchMemory must come from staging()")
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
