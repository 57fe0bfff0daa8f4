"""Backends that run an artifact: one module each behind the :class:`Runner` protocol.

A runner is created cheaply (no GPU touched), ``activate()``d (sessions, engines, device
memory), asked ``infer(feeds)`` any number of times and ``close()``d. ``infer`` takes int32
``inputs`` [B, S] and ``puzzle_identifiers`` [B] and returns float32 numpy arrays:
``logits`` [B, S, V] after the last ACT step and ``q_halt_logits`` [B, steps] per step, and
``step_predictions`` [B, steps, S] (int32 argmax per ACT step) where the backend exposes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hrm_deploy.errors import ArtifactError


class Runner(Protocol):
    name: str  # "torch_ref", "ort", "trt"
    precision: str
    steps: int

    def activate(self) -> None: ...

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


def open_runner(artifact: str | Path, **options: Any) -> Runner:
    """The runner an artifact needs: ``.onnx`` -> ort, ``.engine`` -> trt, else a checkpoint -> torch_ref."""
    path = Path(artifact)
    if not path.exists():
        raise ArtifactError(f"{path} does not exist")
    if path.suffix == ".onnx":
        from hrm_deploy.runners.ort import OrtRunner

        return OrtRunner(path, **options)
    if path.suffix in (".engine", ".plan"):
        from hrm_deploy.runtime.engine import TrtRunner

        return TrtRunner(path, **options)
    from hrm_deploy.runners.torch_ref import TorchRunner

    return TorchRunner(path, **options)
