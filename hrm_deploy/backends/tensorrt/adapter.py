"""The device loop's engine surface for TensorRT 10/11 and TensorRT-RTX 1.x (numpy only, no torch).

See :class:`hrm_deploy.runtime.adapter.EngineAdapter` for what the loop asks of an adapter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hrm_deploy.errors import EngineError
from hrm_deploy.runtime.adapter import TensorSpec

if TYPE_CHECKING:  # checked against tensorrt-stubs by scripts/typecheck_tensorrt.py
    import tensorrt

# TensorRT DataType member name -> device dtype name (hrm_deploy.runtime.memory.DTYPES)
TRT_DTYPES = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
}


def _dims(dims: Any) -> tuple[int, ...]:
    """TensorRT Dims (or any sequence) as a tuple of ints."""
    return tuple(int(dims[i]) for i in range(len(dims)))


class TrtAdapter:
    """TensorRT / TensorRT-RTX. Contexts use USER_MANAGED device memory: the loop allocates one
    scratch buffer (``update_device_memory_size_for_shapes``) shared by its contexts, which run
    one after another on one stream, so the engine's memory is counted and never reallocated."""

    def __init__(
        self,
        trt: Any,
        engine: tensorrt.ICudaEngine,
        memory: Any,
        is_rtx: bool = False,
        backend: Any = None,
        runtime_cache: Any = None,
        cuda_graphs: bool = False,
    ):
        # backend + runtime_cache (TensorRT-RTX): contexts come from api.create_context so
        # the JIT kernels are cached beside the engine instead of recompiled in every process.
        self.trt, self.memory, self.is_rtx = trt, memory, is_rtx
        self.backend, self.runtime_cache = backend, runtime_cache
        self.handles: list[Any] = []  # EngineContext objects: their runtime configs must outlive the contexts
        # RTX runs its own whole-graph capture per execute (api.create_context); the
        # loop's hand-chosen capture stays for standard TensorRT (RTX's JIT kernels make it fragile)
        self.cuda_graphs = cuda_graphs
        self.builtin_graphs = False
        self.profiler: Any = None  # a trt.IProfiler given to every context made after it is set (profile)
        self.engine: tensorrt.ICudaEngine = engine
        self.tensors: dict[str, TensorSpec] = {}
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            kind = engine.get_tensor_dtype(name)
            dtype = TRT_DTYPES.get(getattr(kind, "name", str(kind).rsplit(".", 1)[-1]))
            if dtype is None:
                raise EngineError(
                    f"engine tensor {name} has dtype {kind}, which this runner cannot feed; "
                    "rebuild from an hrm-deploy export"
                )
            shape = _dims(engine.get_tensor_shape(name))
            self.tensors[name] = TensorSpec(name, engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT, dtype, shape)
        first = next(s.name for s in self.tensors.values() if s.is_input)
        low, _, high = engine.get_tensor_profile_shape(first, 0)
        self.batch_range = (int(low[0]), int(high[0]))

    def new_context(self) -> tensorrt.IExecutionContext:
        strategy = self.trt.ExecutionContextAllocationStrategy.USER_MANAGED
        if self.backend is not None and self.is_rtx:
            from hrm_deploy.backends.tensorrt.api import create_context

            handle = create_context(
                self.engine,
                self.backend,
                self.runtime_cache,
                allocation_strategy="user_managed",
                cuda_graphs=self.cuda_graphs,
                shared=self.handles[0] if self.handles else None,  # one runtime cache per engine
            )
            self.handles.append(handle)
            self.builtin_graphs = handle.builtin_graphs
            context = handle.context
        elif self.is_rtx:  # RTX takes the strategy (and its runtime cache) through a runtime config
            config = getattr(self.engine, "create_runtime_config")()  # noqa: B009 - RTX (and TRT >= 10.11) only
            config.set_execution_context_allocation_strategy(strategy)
            context = self.engine.create_execution_context(config)
        else:
            context = self.engine.create_execution_context(strategy)
        if context is None:
            raise EngineError("the engine could not create an execution context (out of GPU memory?)")
        if self.profiler is not None:  # per-layer times, reported by TensorRT after each execute
            context.profiler = self.profiler
        return context

    def save_runtime_caches(self) -> None:
        """Write TensorRT-RTX's runtime cache back (atomically, by the one context that owns it)."""
        for handle in self.handles:
            handle.save_runtime_cache()

    def set_input_shape(self, context: tensorrt.IExecutionContext, name: str, shape: tuple[int, ...]) -> bool:
        return bool(context.set_input_shape(name, shape))

    def output_shape(self, context: tensorrt.IExecutionContext, name: str) -> tuple[int, ...]:
        return _dims(context.get_tensor_shape(name))

    def scratch_bytes(self, context: tensorrt.IExecutionContext) -> int:
        update = getattr(context, "update_device_memory_size_for_shapes", None)
        return int(update() if update is not None else self.engine.device_memory_size_v2)

    def set_scratch(self, context: tensorrt.IExecutionContext, buffer: Any, nbytes: int) -> None:
        if nbytes:
            context.set_device_memory(self.memory.ptr(buffer), nbytes)

    def bind(self, context: tensorrt.IExecutionContext, name: str, buffer: Any) -> None:
        if not context.set_tensor_address(name, self.memory.ptr(buffer)):
            raise EngineError(f"the engine refused the address of tensor {name}")

    def execute(self, context: tensorrt.IExecutionContext) -> None:
        if not context.execute_async_v3(self.memory.stream_handle):
            raise EngineError("execute_async_v3 failed (see TensorRT's log above)")

    def capturable(self, context: tensorrt.IExecutionContext) -> bool:
        if self.is_rtx:
            return False  # RTX: its own per-execute capture (builtin_graphs), never the loop's
        check = getattr(context, "is_stream_capturable", None)
        return bool(check(self.memory.stream_handle)) if check is not None else True
