"""TensorRT / TensorRT-RTX engine runner: numpy + TensorRT, device memory from torch or
cuda-python (:mod:`hrm_deploy.runtime.memory`); no onnx, no torch required.

Full-unroll engines run in one ``execute_async_v3``; single-step engines are driven by a
host loop of ``steps`` enqueues on one stream, the carry kept on the device (each step's
outputs are the next step's inputs) and no host synchronisation between steps, so the
loop is CUDA-graph capturable. The manifest is checked against the running TensorRT and
GPU before deserializing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hrm_deploy.engines.backend import load_backend
from hrm_deploy.engines.compat import check_compatible
from hrm_deploy.errors import EngineError
from hrm_deploy.manifest import read_manifest

if TYPE_CHECKING:
    import tensorrt


def _dims(dims: "tensorrt.Dims") -> tuple[int, ...]:
    return tuple(int(dims[i]) for i in range(len(dims)))


class TrtRunner:
    name = "trt"

    def __init__(self, path: str | Path, steps: int | None = None, device: int = 0, memory: str = "auto"):
        self.path, self.device_index, self.memory_kind = Path(path), device, memory
        self.manifest = read_manifest(self.path)
        self.precision = self.manifest.get("precision", "?")
        self.mode = self.manifest.get("mode", "unrolled")
        self.steps = steps or int(self.manifest.get("steps", 1))
        self._context: Any = None

    def activate(self) -> None:
        from hrm_deploy.runtime.memory import device_memory

        backend = load_backend(self.manifest.get("backend", {}).get("name", "tensorrt"))
        self.memory = device_memory(self.device_index, self.memory_kind)
        check_compatible(self.manifest, backend.name, backend.version, self.memory.capability, self.memory.gpu_name)
        trt = backend.trt
        self._logger: "tensorrt.Logger" = trt.Logger(trt.Logger.WARNING)
        runtime: "tensorrt.Runtime" = trt.Runtime(self._logger)
        engine: "tensorrt.ICudaEngine | None" = runtime.deserialize_cuda_engine(self.path.read_bytes())
        if engine is None:
            raise EngineError(f"{backend.name} {backend.version} could not deserialize {self.path}; rebuild it here")
        self._trt, self._runtime, self._engine = trt, runtime, engine
        self._context = engine.create_execution_context()

    def _np_dtype(self, name: str) -> np.dtype:
        trt = self._trt
        kinds = {trt.float32: np.float32, trt.float16: np.float16, trt.int32: np.int32, trt.bool: np.bool_,
                 trt.int64: np.int64}
        return np.dtype(kinds[self._engine.get_tensor_dtype(name)])

    def _enqueue(self, tensors: dict[str, Any]) -> dict[str, Any]:
        """Bind inputs, allocate and bind outputs, enqueue on the stream; returns the outputs."""
        context: "tensorrt.IExecutionContext" = self._context
        for name, buffer in tensors.items():
            context.set_input_shape(name, tuple(buffer.shape))
            context.set_tensor_address(name, self.memory.ptr(buffer))
        outputs = {}
        for i in range(self._engine.num_io_tensors):
            name = self._engine.get_tensor_name(i)
            if self._engine.get_tensor_mode(name) == self._trt.TensorIOMode.OUTPUT:
                outputs[name] = self.memory.empty(_dims(context.get_tensor_shape(name)), self._np_dtype(name))
                context.set_tensor_address(name, self.memory.ptr(outputs[name]))
        if not context.execute_async_v3(self.memory.handle):
            raise EngineError(f"execute_async_v3 failed on {self.path.name}")
        return outputs

    def infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            return self._infer(feeds)
        finally:
            self.memory.release()

    def _infer(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Also sets ``last_timing``: host-to-device, GPU compute and device-to-host milliseconds
        from CUDA events on the stream (the loop itself is never synchronised)."""
        begin = self.memory.mark()
        inputs = {k: self.memory.upload(feeds[k].astype(np.int32)) for k in ("inputs", "puzzle_identifiers")}
        uploaded = self.memory.mark()
        if self.mode != "step":
            out = self._enqueue(inputs)
            computed = self.memory.mark()
            result = {"logits": self.memory.download(out["logits"]).astype(np.float32),
                      "q_halt_logits": self.memory.download(out["q_halt_logits"]).astype(np.float32)}
            self._record_timing(begin, uploaded, computed)
            return result
        n = len(feeds["inputs"])
        carry_shape = (n, *_dims(self._engine.get_tensor_shape("z_H"))[1:])
        zeros = np.zeros(carry_shape, self._np_dtype("z_H"))
        carry = {"z_H": self.memory.upload(zeros), "z_L": self.memory.upload(zeros)}
        resets = [self.memory.upload(np.full((n,), step == 0)) for step in range(min(self.steps, 2))]
        uploaded = self.memory.mark()
        halts, step_logits = [], []
        for step in range(self.steps):  # no host sync inside the loop
            out = self._enqueue({**inputs, **carry, "reset": resets[min(step, 1)]})
            carry = {"z_H": out["z_H_out"], "z_L": out["z_L_out"]}
            halts.append(out["q_halt_logits"])
            step_logits.append(out["logits"])
        computed = self.memory.mark()
        predictions = [self.memory.download(t).argmax(-1).astype(np.int32) for t in step_logits]
        result = {"logits": self.memory.download(out["logits"]).astype(np.float32),
                  "q_halt_logits": np.stack([self.memory.download(h) for h in halts], 1).astype(np.float32),
                  "step_predictions": np.stack(predictions, 1)}
        self._record_timing(begin, uploaded, computed)
        return result

    def _record_timing(self, begin: Any, uploaded: Any, computed: Any) -> None:
        done = self.memory.mark()
        self.memory.synchronize()
        self.last_timing = {"h2d_ms": self.memory.elapsed_ms(begin, uploaded),
                            "compute_ms": self.memory.elapsed_ms(uploaded, computed),
                            "d2h_ms": self.memory.elapsed_ms(computed, done)}

    def close(self) -> None:
        self._context = None
