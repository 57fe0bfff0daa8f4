"""Engine adapters: the exact surface of an engine the device loop uses, and nothing more.

An adapter describes its I/O tensors (:class:`TensorSpec`) and its batch range, hands out
*contexts* (one set of bindings each: the step loop keeps two, one per carry parity, so no
binding changes per step), sets input shapes (``set_input_shape -> bool``, never ignored),
binds device buffers and enqueues on the memory backend's one stream.

Each backend brings its own: :mod:`hrm_deploy.backends.tensorrt.adapter` (TensorRT 10/11 and
TensorRT-RTX 1.x, numpy only, no torch) and the PyTorch engine's in
:mod:`hrm_deploy.backends.torch.runner`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class TensorSpec:
    """One engine I/O tensor; ``shape`` has -1 for the (dynamic) batch."""

    name: str
    is_input: bool
    dtype: str
    shape: tuple[int, ...]

    def at(self, batch: int) -> tuple[int, ...]:
        return tuple(batch if d == -1 else d for d in self.shape)


class EngineAdapter(Protocol):
    tensors: dict[str, TensorSpec]
    batch_range: tuple[int, int]  # (min, max) batch the engine accepts

    def new_context(self) -> Any: ...
    def set_input_shape(self, context: Any, name: str, shape: tuple[int, ...]) -> bool: ...
    def output_shape(self, context: Any, name: str) -> tuple[int, ...]: ...
    def scratch_bytes(self, context: Any) -> int: ...
    def set_scratch(self, context: Any, buffer: Any, nbytes: int) -> None: ...
    def bind(self, context: Any, name: str, buffer: Any) -> None: ...
    def execute(self, context: Any) -> None: ...
    def capturable(self, context: Any) -> bool: ...
