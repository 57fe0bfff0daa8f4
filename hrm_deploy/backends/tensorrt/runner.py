"""TensorRT / TensorRT-RTX engine runner: numpy + TensorRT + a memory backend (torch or
cuda-python); imports no torch and no onnx itself, so a Jetson needs neither.

The manifest is checked against the running backend and GPU before deserializing
(:func:`hrm_deploy.runtime.compat.check_compatible`); the engine then runs through
:class:`~hrm_deploy.backends.tensorrt.adapter.TrtAdapter` and the
:class:`~hrm_deploy.runtime.device_loop.DeviceLoop` (one stream, buffers and bindings once per
batch size, the step loop captured as a CUDA graph). Batches above the engine profile's max
are split into profile-sized chunks by the :class:`~hrm_deploy.runtime.base.Runner` base.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from hrm_deploy.backends.tensorrt.api import deserialize, load_backend, recording_logger, runtime_cache_path
from hrm_deploy.contract import CARRY
from hrm_deploy.errors import EngineError
from hrm_deploy.manifest import read_verified
from hrm_deploy.runtime.base import LoopRunner
from hrm_deploy.runtime.compat import check_compatible

log = logging.getLogger(__name__)


class TrtRunner(LoopRunner):
    """TensorRT / TensorRT-RTX engines (options: see :class:`~hrm_deploy.runtime.base.LoopRunner`)."""

    name = "tensorrt"

    def _activate(self) -> None:
        from hrm_deploy.backends.tensorrt.adapter import TrtAdapter
        from hrm_deploy.runtime.device_loop import DeviceLoop
        from hrm_deploy.runtime.memory import device_memory
        from hrm_deploy.system import has_cuda_gpu

        if self.memory_kind != "host" and not has_cuda_gpu():  # the real reason first, not a missing package
            raise EngineError(
                f"no CUDA GPU on this machine: {self.path.name} is a TensorRT engine and runs on an NVIDIA GPU "
                "(here, use the ONNX export or a --target cpu build)"
            )
        backend = load_backend(self.manifest.get("backend", {}).get("name", "tensorrt"))
        self.memory = device_memory(self.device_index, self.memory_kind)
        trt = backend.trt
        self._logger = recording_logger(trt)
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
            log.warning(warning)
        if self.manifest.get("weights_stripped"):  # refit from its graph on first run (saved whole for the next)
            blob = self._refitted(backend, blob)
        self._engine = deserialize(backend, self._runtime, self._logger, blob, self.path)
        adapter = TrtAdapter(
            trt,
            self._engine,
            self.memory,
            is_rtx=backend.is_rtx,
            backend=backend,
            runtime_cache=runtime_cache_path(self.path),
            cuda_graphs=self.cuda_graph,
        )
        self._adapter = adapter
        self.loop = DeviceLoop(
            adapter,
            self.memory,
            self.requested_steps or int(self.manifest.get("steps", 1))
            if CARRY[0] in adapter.tensors  # a step engine
            else self.requested_steps,
            cuda_graph=self.cuda_graph,
            step_predictions=self.step_predictions,
        )
        self.mode, self.steps = self.loop.mode, self.loop.steps
        self.min_batch, self.max_batch = adapter.batch_range
        self.seq_len = adapter.tensors["inputs"].shape[-1]

    def _refitted(self, backend: Any, blob: bytes) -> bytes:
        """The whole engine of a weight-stripped one: an earlier refit saved beside it, else refit now
        from the graph the manifest names (its sha256 checked first) and saved
        (:mod:`hrm_deploy.backends.tensorrt.refit`)."""
        from hrm_deploy.backends.tensorrt.refit import refit, refit_source, save_refitted, saved_refit
        from hrm_deploy.io import sha256_bytes

        digest = sha256_bytes(blob)
        saved = saved_refit(self.path, digest)
        if saved is not None:
            return saved
        graph, data = refit_source(self.path, self.manifest)
        stripped = deserialize(backend, self._runtime, self._logger, blob, self.path)
        whole = refit(backend.trt, self._logger, stripped, graph, data)
        save_refitted(self.path, self.manifest, whole, digest)
        return whole

    def attach_profiler(self, make: Callable[[Any], Any]) -> Any:
        """``make(tensorrt_module)`` (a ``trt.IProfiler``), given to the engine's execution
        contexts for per-layer times, and returned. Call it after :meth:`activate` and before the first ``infer`` (contexts
        are made per batch size on first use), on a runner made with ``cuda_graph=False``: a
        captured step loop replays without reporting layers."""
        if self.cuda_graph:
            from hrm_deploy.errors import InternalError

            raise InternalError("per-layer profiling needs a runner made with cuda_graph=False")
        self._adapter.profiler = make(self._adapter.trt)
        return self._adapter.profiler

    def _before_close(self) -> None:
        self._adapter.save_runtime_caches()
        self._engine = None
