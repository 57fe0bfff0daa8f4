"""TensorRT / TensorRT-RTX engine runner: numpy + TensorRT + a memory backend (torch or
cuda-python); imports no torch and no onnx itself, so a Jetson needs neither.

The manifest is checked against the running backend and GPU before deserializing
(:func:`hrm_deploy.engines.compat.check_compatible`); the engine then runs through
:class:`~hrm_deploy.runners.adapter.TrtAdapter` and the
:class:`~hrm_deploy.runners.device_loop.DeviceLoop` (one stream, buffers and bindings once per
batch size, the step loop captured as a CUDA graph). Batches above the engine profile's max
are split into profile-sized chunks by the :class:`~hrm_deploy.runners.base.Runner` base.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.engines.backend import load_backend, runtime_cache_path
from hrm_deploy.engines.compat import check_compatible
from hrm_deploy.errors import EngineError
from hrm_deploy.manifest import read_manifest, read_verified
from hrm_deploy.runners.base import HaltFn, Runner


class TrtRunner(Runner):
    """Options: ``steps`` (step engines only; an unrolled engine's count is fixed), ``device``
    (GPU index), ``memory`` ("auto", "torch", "cuda-python"), ``cuda_graph`` (capture the step
    loop), ``step_predictions`` (keep per-step argmax)."""

    name = "trt"
    supports_halt = True  # step engines; an unrolled engine refuses a halt rule with one clear error

    def __init__(
        self,
        path: str | Path,
        steps: int | None = None,
        device: int = 0,
        memory: str = "auto",
        cuda_graph: bool = True,
        step_predictions: bool = True,
    ):
        self.path, self.device_index, self.memory_kind = Path(path), device, memory
        self.manifest = read_manifest(self.path)
        self.precision = self.manifest.get("precision", "?")
        self.mode = self.manifest.get("mode", "unrolled")
        self.requested_steps = steps
        self.steps = int(self.manifest.get("steps", 1)) if steps is None or self.mode != "step" else steps
        self.cuda_graph, self.step_predictions = cuda_graph, step_predictions
        self.loop: Any = None

    def _activate(self) -> None:
        from hrm_deploy.runners.adapter import TrtAdapter
        from hrm_deploy.runners.device_loop import DeviceLoop
        from hrm_deploy.runners.memory import device_memory

        backend = load_backend(self.manifest.get("backend", {}).get("name", "tensorrt"))
        self.memory = device_memory(self.device_index, self.memory_kind)
        trt = backend.trt
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        blob, _ = read_verified(self.path, require_manifest=True)  # the bytes we hash are the bytes we load
        for warning in (
            check_compatible(
                self.manifest,
                backend.name,
                backend.version,
                self.memory.capability,
                self.memory.gpu_name,
                engine_bytes=blob,
                runtime=self._runtime,
            )
            or []
        ):
            print(f"warning: {warning}", file=sys.stderr)
        engine = self._runtime.deserialize_cuda_engine(blob)
        if engine is None:
            raise EngineError(f"{backend.name} {backend.version} could not deserialize {self.path}; rebuild it here")
        self._engine = engine
        adapter = TrtAdapter(
            trt,
            engine,
            self.memory,
            is_rtx=backend.is_rtx,
            backend=backend,
            runtime_cache=runtime_cache_path(self.path),
        )
        self._adapter = adapter
        self.loop = DeviceLoop(
            adapter,
            self.memory,
            self.requested_steps or int(self.manifest.get("steps", 1))
            if "z_H" in adapter.tensors
            else self.requested_steps,
            cuda_graph=self.cuda_graph,
            step_predictions=self.step_predictions,
        )
        self.mode, self.steps = self.loop.mode, self.loop.steps
        self.min_batch, self.max_batch = adapter.batch_range
        self.seq_len = adapter.tensors["inputs"].shape[-1]

    def _infer(self, feeds: dict[str, np.ndarray], halt: HaltFn | None) -> dict[str, np.ndarray]:
        out, self.last_timing = self.loop.run(feeds, halt)
        return out

    def _close(self) -> None:
        if self.loop is not None:
            self._adapter.save_runtime_caches()
            self.loop.close()
        self.loop = None
        self._engine = None
        self.memory.close()
