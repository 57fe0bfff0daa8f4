"""The engine build itself, run in a child process (``python -m hrm_deploy.engines.worker
SPEC.json``) so torch's memory is not held during the build and a builder crash is a clean
error in the parent. Reads a JSON spec, writes the serialized engine and a JSON result."""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrm_deploy.engines.backend import Backend, load_backend

if TYPE_CHECKING:  # type-checked against tensorrt-stubs (TensorRT 10.x API); RTX shares it
    import tensorrt

PARSE_FAILED, BUILD_FAILED = 3, 4


def _parser_errors(parser: "tensorrt.OnnxParser") -> list[str]:
    errors = []
    for i in range(parser.num_errors):
        e = parser.get_error(i)
        node = getattr(e, "node_name", lambda: "")() or str(getattr(e, "node", lambda: "?")())
        op = getattr(e, "node_operator", lambda: "")()
        errors.append(f"node {node} ({op}): {e.desc()}")
    return errors


def _network_precisions(backend: Backend, network: "tensorrt.INetworkDefinition") -> dict[str, Any]:
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


def _inspect_engine(backend: Backend, logger: "tensorrt.ILogger", plan: bytes) -> dict[str, Any]:
    """Per-layer precisions of the built engine; needs a GPU the engine can load on."""
    trt = backend.trt
    try:
        engine: "tensorrt.ICudaEngine | None" = trt.Runtime(logger).deserialize_cuda_engine(plan)
        if engine is None:
            return {"available": False, "reason": "the engine does not load on this machine (no suitable GPU)"}
        inspector: "tensorrt.EngineInspector" = engine.create_engine_inspector()
        info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
        layers = info.get("Layers", [])
        text = json.dumps(layers)
        return {"available": True, "layers": len(layers),
                "mentions": {p: text.count(p) for p in ("Half", "BF16", "Int8", "Float")}}
    except Exception as exc:  # noqa: BLE001 - no GPU / driver raises various types
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"[:300]}


def build(spec: dict[str, Any]) -> int:
    backend = load_backend(spec["backend"])
    trt = backend.trt
    logger: "tensorrt.Logger" = trt.Logger(trt.Logger.WARNING)
    builder: "tensorrt.Builder" = trt.Builder(logger)
    network = builder.create_network(backend.network_flags())
    parser: "tensorrt.OnnxParser" = trt.OnnxParser(network, logger)
    result: dict[str, Any] = {"backend": backend.name, "version": backend.version}
    start = time.perf_counter()
    print("parsing ONNX", flush=True)
    if not parser.parse_from_file(spec["onnx"]):
        result["parser_errors"] = _parser_errors(parser)
        Path(spec["result"]).write_text(json.dumps(result))
        return PARSE_FAILED
    result["network"] = _network_precisions(backend, network)
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(spec["workspace_mib"]) << 20)
    config.builder_optimization_level = int(spec["optimization_level"])
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in spec["shapes"].items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    backend.set_compute_capability(config, spec.get("compute_capability"))
    cache = None
    if spec.get("timing_cache") and backend.supports_timing_cache():
        path = Path(spec["timing_cache"])
        cache = config.create_timing_cache(path.read_bytes() if path.is_file() else b"")
        config.set_timing_cache(cache, ignore_mismatch=False)
    print(f"building ({result['network']['layers']} layers)", flush=True)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        Path(spec["result"]).write_text(json.dumps(result))
        return BUILD_FAILED
    data = bytes(plan)
    Path(spec["out"]).write_bytes(data)
    if cache is not None:
        Path(spec["timing_cache"]).write_bytes(bytes(cache.serialize()))
    result.update(build_seconds=round(time.perf_counter() - start, 2), engine_bytes=len(data),
                  peak_host_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  engine_inspection=_inspect_engine(backend, logger, data))
    Path(spec["result"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    from hrm_deploy.errors import HRMDeployError

    try:
        sys.exit(build(json.loads(Path(sys.argv[1]).read_text())))
    except HRMDeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
