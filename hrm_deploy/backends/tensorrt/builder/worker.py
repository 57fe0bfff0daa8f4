"""The engine build itself, run in a child process (``python -m hrm_deploy.backends.tensorrt.builder.worker
SPEC.json``) so torch's memory is not held during the build and a builder crash is a clean
error in the parent. Reads a JSON spec, writes the serialized engine and a JSON result.

What it is doing goes, one line at a time, to the file descriptor ``spec["progress_fd"]`` (the
parent's stage display shows the latest): parsing, then the builder's own phases where TensorRT
has an ``IProgressMonitor`` (``Building engine 4/6 > Computing profile costs 3/5 > ...``)."""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from hrm_deploy.backends.tensorrt.api import Backend, load_backend
from hrm_deploy.backends.tensorrt.builder.layers import summarize_layers
from hrm_deploy.io import atomic_path

if TYPE_CHECKING:  # type-checked against tensorrt-stubs (TensorRT 10.x API); RTX shares it
    import tensorrt

PARSE_FAILED, BUILD_FAILED = 3, 4
MAX_PHASE_DEPTH = 4  # deeper phases (per-tensor reformat costs...) change too fast to be worth reading
STEP_REPORT_S = 1.0  # step counts are reported at most this often; phase changes always


class _Say:
    """One status line at a time to the parent (``spec["progress_fd"]``), else to stdout."""

    def __init__(self, fd: int | None):
        # closefd=False: the descriptor is the parent's to close (and a process's exit closes it anyway)
        self.stream: TextIO = os.fdopen(fd, "w", buffering=1, closefd=False) if fd is not None else sys.stdout
        self.lock = threading.Lock()  # the builder reports from its own threads

    def __call__(self, text: str) -> None:
        with self.lock:
            try:
                self.stream.write(text.replace("\n", " ") + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # the parent stopped listening: the build goes on
                pass


def describe_phases(phases: dict[str, list[Any]]) -> str:
    """``{name: [parent, steps done, steps]}`` (in start order) -> ``A 4/6 > B > C 3/5``, outermost first."""
    parts = [f"{name} {done}/{total}" if total > 1 else name for name, (_, done, total) in phases.items()]
    return " > ".join(parts[:MAX_PHASE_DEPTH])


def _progress_monitor(trt: Any, say: _Say) -> Any:
    """A TensorRT ``IProgressMonitor`` that says the builder's current phases, or None where the
    installed TensorRT has none (the parent's stage then prints a heartbeat with the elapsed time)."""
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        return None

    class Monitor(base):  # type: ignore[misc,valid-type]  # the installed module's class; called from its threads
        def __init__(self) -> None:
            super().__init__()  # pybind11: the base must be initialised explicitly
            self.lock = threading.Lock()
            self.phases: dict[str, list[Any]] = {}
            self.last = 0.0

        def _say(self, force: bool) -> None:
            now = time.monotonic()
            if force or now - self.last >= STEP_REPORT_S:
                self.last = now
                say(describe_phases(self.phases))

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            with self.lock:
                self.phases[phase_name] = [parent_phase, 0, int(num_steps)]
                self._say(force=len(self.phases) <= MAX_PHASE_DEPTH)

        def step_complete(self, phase_name: str, step: int) -> bool:
            with self.lock:
                if phase_name in self.phases:
                    self.phases[phase_name][1] = int(step) + 1
                self._say(force=False)
            return True  # False would cancel the build

        def phase_finish(self, phase_name: str) -> None:
            with self.lock:
                self.phases.pop(phase_name, None)

    return Monitor()


def _parser_errors(parser: tensorrt.OnnxParser) -> list[str]:
    errors = []
    for i in range(parser.num_errors):
        e = parser.get_error(i)
        node = getattr(e, "node_name", lambda: "")() or str(getattr(e, "node", lambda: "?")())
        op = getattr(e, "node_operator", lambda: "")()
        errors.append(f"node {node} ({op}): {e.desc()}")
    return errors


def _network_precisions(backend: Backend, network: tensorrt.INetworkDefinition) -> dict[str, Any]:
    """Output dtypes of the strongly typed network's layers: what precision the graph carries."""
    trt = backend.trt
    dtypes: dict[str, int] = {}
    qdq = 0
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.type in (trt.LayerType.QUANTIZE, trt.LayerType.DEQUANTIZE):
            qdq += 1
        if layer.num_outputs:
            name = str(layer.get_output(0).dtype).split(".")[-1]
            dtypes[name] = dtypes.get(name, 0) + 1
    return {"layers": network.num_layers, "output_dtypes": dtypes, "qdq_layers": qdq}


def _inspect_engine(
    backend: Backend, logger: tensorrt.ILogger, plan: bytes, shapes: dict[str, list[list[int]]]
) -> tuple[dict[str, Any], str | None]:
    """(summary of the engine's per-layer precisions, the inspector's JSON text); needs a GPU
    the engine loads on. The builder set ``ProfilingVerbosity.DETAILED``; the inspector reads an
    execution context whose input shapes are the profile's opt shapes (without them TensorRT
    shows no tensor formats)."""
    trt = backend.trt
    try:
        engine: tensorrt.ICudaEngine | None = trt.Runtime(logger).deserialize_cuda_engine(plan)
        if engine is None:
            return {"available": False, "reason": "the engine does not load on this machine (no suitable GPU)"}, None
        context: tensorrt.IExecutionContext = engine.create_execution_context()
        unset = [name for name, (_, opt, _) in shapes.items() if not context.set_input_shape(name, opt)]
        inspector: tensorrt.EngineInspector = engine.create_engine_inspector()
        inspector.execution_context = context
        text = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
        summary = summarize_layers(text)
        return {"available": True, "shapes_set": not unset, "unset_inputs": unset, "summary": summary}, text
    except Exception as exc:  # noqa: BLE001 - no GPU / driver raises various types
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"[:300]}, None


def _attach_timing_cache(
    backend: Backend, config: tensorrt.IBuilderConfig, path: Path, result: dict[str, Any]
) -> tensorrt.ITimingCache | None:
    """Load the GPU/version-keyed timing cache; a stale one is dropped (and said so), not ignored."""
    if not backend.supports_timing_cache():
        result["timing_cache"] = {"used": False, "reason": f"{backend.name} has no timing cache"}
        return None
    blob = path.read_bytes() if path.is_file() else b""
    cache = config.create_timing_cache(blob)
    if config.set_timing_cache(cache, ignore_mismatch=False):
        result["timing_cache"] = {"used": True, "path": str(path), "loaded_bytes": len(blob)}
        return cache
    warning = (
        f"timing cache {path} does not match this GPU and {backend.name} {backend.version}; "
        "building without it (a fresh cache replaces it)"
    )
    print(f"warning: {warning}", file=sys.stderr, flush=True)
    result.setdefault("warnings", []).append(warning)
    cache = config.create_timing_cache(b"")
    if not config.set_timing_cache(cache, ignore_mismatch=False):
        result["timing_cache"] = {"used": False, "path": str(path), "reason": "TensorRT refused an empty cache"}
        return None
    result["timing_cache"] = {"used": True, "path": str(path), "loaded_bytes": 0, "stale_dropped": True}
    return cache


def build(spec: dict[str, Any]) -> int:
    backend = load_backend(spec["backend"])
    trt = backend.trt
    logger: tensorrt.Logger = trt.Logger(trt.Logger.WARNING)
    builder: tensorrt.Builder = trt.Builder(logger)
    network = builder.create_network(backend.network_flags())
    parser: tensorrt.OnnxParser = trt.OnnxParser(network, logger)
    result: dict[str, Any] = {"backend": backend.name, "version": backend.version}
    start = time.perf_counter()
    say = _Say(spec.get("progress_fd"))
    say("parsing ONNX")
    if not parser.parse_from_file(spec["onnx"]):
        result["parser_errors"] = _parser_errors(parser)
        Path(spec["result"]).write_text(json.dumps(result))
        return PARSE_FAILED
    result["network"] = _network_precisions(backend, network)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(spec["workspace_mib"]) << 20)
    config.builder_optimization_level = int(spec["optimization_level"])
    # Without DETAILED the inspector lists layer names only and no precision can be read.
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in spec["shapes"].items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    backend.set_compute_capability(config, spec.get("compute_capability"))
    # RTX: user-allocated memory keeps the engine's buffers the loop's (and graph-capturable);
    # the flag exists from TensorRT-RTX 1.2, older builds go without it
    user_allocation = getattr(trt.BuilderFlag, "REQUIRE_USER_ALLOCATION", None) if backend.is_rtx else None
    if user_allocation is not None:
        config.set_flag(user_allocation)
        result["require_user_allocation"] = True
    if spec.get("strip_weights"):  # the plan without its weights, refit from the same graph on first run
        config.set_flag(trt.BuilderFlag.STRIP_PLAN)
        config.set_flag(trt.BuilderFlag.REFIT_IDENTICAL)
        result["weights_stripped"] = True
    cache = None
    if spec.get("timing_cache"):
        cache = _attach_timing_cache(backend, config, Path(spec["timing_cache"]), result)
    say(f"building ({result['network']['layers']} network layers)")
    monitor = _progress_monitor(trt, say)
    if monitor is not None:
        config.progress_monitor = monitor  # kept referenced by `monitor` until the build returns
    result["progress_monitor"] = monitor is not None
    plan = builder.build_serialized_network(network, config)
    say("serializing and inspecting the engine")
    if plan is None:
        Path(spec["result"]).write_text(json.dumps(result))
        return BUILD_FAILED
    data = bytes(plan)
    Path(spec["out"]).write_bytes(data)
    if cache is not None:
        with atomic_path(spec["timing_cache"]) as tmp:
            tmp.write_bytes(bytes(cache.serialize()))
    inspection, layers_json = _inspect_engine(backend, logger, data, spec["shapes"])
    if layers_json is not None and spec.get("layers_out"):
        Path(spec["layers_out"]).write_text(layers_json)
    result.update(
        build_seconds=round(time.perf_counter() - start, 2),
        engine_bytes=len(data),
        peak_host_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        engine_inspection=inspection,
    )
    Path(spec["result"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    from hrm_deploy.errors import HRMDeployError

    try:
        sys.exit(build(json.loads(Path(sys.argv[1]).read_text())))
    except HRMDeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
