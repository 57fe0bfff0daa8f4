"""The engine stage: precision ONNX -> serialized TensorRT / TensorRT-RTX engine + manifest.

``build_engine`` is one function from artifact to artifact. An FP32 graph asked for a lower
precision first goes through :func:`hrm_deploy.calib.convert.make_precision_graph` (INT8:
calibration, and it says so). The build runs in a child process; the engine is written
atomically and only when the requested precision is visibly in the network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hrm_deploy.engines.backend import load_backend
from hrm_deploy.engines.targets import TargetProfile, get_target
from hrm_deploy.errors import ArtifactError, ConfigError, EngineError, require
from hrm_deploy.gpu import IDENTITY, nvidia_smi
from hrm_deploy.io import atomic_path, sha256_file
from hrm_deploy.manifest import read_manifest, manifest_path, write_manifest
from hrm_deploy.progress import Stages

ENGINE_PRECISIONS = ("fp32", "fp16", "bf16", "int8")
# Host memory of a TensorRT build per ONNX node, measured: the 16-step Sudoku unroll
# (58,206 nodes, 152 MB) peaked at 9.3 GB in TensorRT-RTX on 2 cores.
BUILD_MIB_PER_NODE = 0.16


@dataclass(frozen=True)
class EngineConfig:
    """What to build; None fields take the target profile's default."""

    precision: str = "fp16"
    target: str = "desktop"
    backend: str | None = None
    min_batch: int | None = None
    opt_batch: int | None = None
    max_batch: int | None = None
    workspace_mib: int | None = None
    optimization_level: int | None = None
    compute_capability: str | None = None
    calib_data: str | None = None
    calib_method: str = "minmax"  # see QuantConfig: measured defaults
    calib_samples: int = 128
    accuracy_budget: float | None = None
    timing_cache: str | None = "engines/timing.cache"
    threads: int | None = None  # cpu target: ONNX Runtime intra-op threads (None: one per core)

    def __post_init__(self) -> None:
        if self.precision not in ENGINE_PRECISIONS:
            raise ConfigError(f"precision {self.precision!r} unknown; use one of {', '.join(ENGINE_PRECISIONS)}")


@dataclass
class EngineResult:
    path: Path
    manifest: Path
    source_onnx: Path
    build: dict[str, Any] = field(default_factory=dict)


def newest_export(folder: str | Path = "export") -> Path:
    """The most recently written FP32 export in ``folder``."""
    candidates = [p for p in Path(folder).glob("*.onnx")
                  if not any(p.name.endswith(f".{x}.onnx") for x in ("fp16", "bf16", "int8"))]
    if not candidates:
        raise ArtifactError(f"no ONNX export in {folder}/; run `hrm-deploy export` first or pass the ONNX path")
    return max(candidates, key=lambda p: p.stat().st_mtime)


def _graph_info(path: Path) -> tuple[dict[str, Any], dict[str, list[Any]], int]:
    """(hrm_deploy metadata, input name -> dims with None for dynamic, node count)."""
    onnx = require("onnx", "onnx", "Building engines")
    from hrm_deploy.calib.accuracy import graph_metadata

    model = onnx.load(str(path), load_external_data=False)
    dims = {i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input}
    return graph_metadata(model), dims, len(model.graph.node)


def _shapes(dims: dict[str, list[Any]], lo: int, opt: int, hi: int) -> dict[str, list[list[int]]]:
    shapes = {}
    for name, d in dims.items():
        if any(x is None for x in d[1:]):
            raise EngineError(f"input {name} has a dynamic dimension besides the batch; re-export with fixed sizes")
        shapes[name] = [[b] + list(d[1:]) for b in (lo, opt, hi)]
    return shapes


def _check_memory_budget(target: TargetProfile, nodes: int, onnx_bytes: int) -> int:
    estimate = int(nodes * BUILD_MIB_PER_NODE + 3 * onnx_bytes / 2**20)
    if target.memory_budget_mib and estimate > target.memory_budget_mib * 0.75:
        raise EngineError(
            f"building this graph ({nodes} nodes) needs about {estimate} MiB of host memory, more than "
            f"{target.name}'s shared {target.memory_budget_mib} MiB allows; export the single-step graph "
            f"(hrm-deploy export --mode step) and build that")
    return estimate


def _precision_source(onnx_path: Path, config: EngineConfig, stages: Stages, quiet: bool) -> Path:
    meta, _, _ = _graph_info(onnx_path)
    have = meta.get("precision", "fp32")
    if have == config.precision:
        return onnx_path
    if have != "fp32":
        raise ConfigError(f"{onnx_path} is a {have} graph but {config.precision} was asked for; pass the FP32 export")
    from hrm_deploy.calib.convert import PrecisionConfig, make_precision_graph
    from hrm_deploy.calib.int8 import QuantConfig

    if not quiet:
        what = "calibrating and quantizing" if config.precision == "int8" else "converting"
        print(f"{onnx_path.name} is FP32: {what} it to {config.precision} first", file=sys.stderr, flush=True)
    quant = QuantConfig(method=config.calib_method, samples=config.calib_samples)
    result = make_precision_graph(onnx_path, PrecisionConfig(config.precision, calib_data=config.calib_data,
                                                             quant=quant, accuracy_budget=config.accuracy_budget),
                                  quiet=quiet)
    return result.path


def _check_precision_took(precision: str, build: dict[str, Any]) -> None:
    """Fail when the requested precision is not visible in the network (or, on a GPU, the engine)."""
    network = build.get("network", {})
    dtypes = network.get("output_dtypes", {})
    missing = None
    if precision == "fp16" and not dtypes.get("HALF"):
        missing = "no layer computes in FP16"
    elif precision == "bf16" and not dtypes.get("BF16"):
        missing = "no layer computes in BF16"
    elif precision == "int8" and not network.get("qdq_layers"):
        missing = "no Q/DQ layers"
    inspection = build.get("engine_inspection", {})
    if not missing and inspection.get("available"):
        key = {"fp16": "Half", "bf16": "BF16", "int8": "Int8"}.get(precision)
        if key and not inspection["mentions"].get(key):
            missing = f"the built engine has no {key} layer (a silently FP32 engine)"
    if missing:
        raise EngineError(f"requested {precision} but {missing}; the engine was not written. Check the ONNX "
                          "with `hrm-deploy inspect` and rebuild it from the FP32 export")


def build_engine(onnx_path: str | os.PathLike | None, config: EngineConfig, out: str | os.PathLike | None = None,
                 quiet: bool = False) -> EngineResult:
    """Build an engine for ``config.target`` from ``onnx_path`` (default: newest export).
    The ``cpu`` target makes an ORT-optimized ONNX instead (:mod:`hrm_deploy.engines.cpu`)."""
    target = get_target(config.target)
    if target.name == "cpu":
        from hrm_deploy.engines.cpu import CpuBuildConfig, build_cpu

        cpu = build_cpu(onnx_path if onnx_path else newest_export(), CpuBuildConfig(config.precision, config.threads),
                        out, quiet)
        return EngineResult(cpu.path, cpu.manifest, cpu.source_onnx, cpu.build)
    backend_name = config.backend or target.backends[0]
    if backend_name not in target.backends:
        raise ConfigError(f"target {target.name} builds with {' or '.join(target.backends)}, not {backend_name}")
    backend = load_backend(backend_name)  # fail before any conversion work when the backend is missing
    backend.compute_capability(config.compute_capability or target.compute_capability)  # validate early
    stages = Stages(quiet)
    src = Path(onnx_path) if onnx_path else newest_export()
    if not src.is_file():
        raise ArtifactError(f"{src} does not exist; run `hrm-deploy export` first")
    graph = _precision_source(src, config, stages, quiet) if config.precision != "fp32" else src
    meta, dims, nodes = _graph_info(graph)
    estimate = _check_memory_budget(target, nodes, graph.stat().st_size)
    lo = config.min_batch or target.min_batch
    hi = config.max_batch or target.max_batch
    opt = config.opt_batch or min(max(target.opt_batch, lo), hi)
    if not lo <= opt <= hi:
        raise ConfigError(f"batch profile needs min <= opt <= max, got {lo}/{opt}/{hi}")
    spec: dict[str, Any] = {"backend": backend.name, "onnx": str(graph.resolve()), "shapes": _shapes(dims, lo, opt, hi),
            "workspace_mib": config.workspace_mib or target.workspace_mib,
            "optimization_level": config.optimization_level if config.optimization_level is not None
            else target.builder_optimization_level,
            "compute_capability": config.compute_capability or target.compute_capability,
            "timing_cache": config.timing_cache}
    stem = graph.name[:-len(".onnx")]
    target_path = Path(out) if out else Path("engines") / f"{stem}.{target.name}.{backend.name}.engine"
    with atomic_path(target_path) as tmp, tempfile.TemporaryDirectory() as work:
        spec_file, result_file = Path(work) / "spec.json", Path(work) / "result.json"
        spec.update(out=str(tmp), result=str(result_file))
        spec_file.write_text(json.dumps(spec))
        if spec["timing_cache"]:
            Path(spec["timing_cache"]).parent.mkdir(parents=True, exist_ok=True)
        with stages.stage(f"building {config.precision} engine with {backend.name} {backend.version} "
                          f"for {target.name} ({nodes} ONNX nodes, in a child process)"):
            child = subprocess.run([sys.executable, "-m", "hrm_deploy.engines.worker", str(spec_file)],
                                   capture_output=True, text=True)
        build = json.loads(result_file.read_text()) if result_file.is_file() else {}
        if child.returncode != 0:
            if build.get("parser_errors"):
                raise EngineError(f"{backend.name} could not parse {graph.name}:\n  " + "\n  ".join(build["parser_errors"]))
            tail = "\n".join((child.stderr or child.stdout).strip().splitlines()[-8:])
            raise EngineError(f"{backend.name} failed to build {graph.name} (exit {child.returncode}):\n{tail}")
        _check_precision_took(config.precision, build)
    recipe = read_manifest(graph).get("report", {}) if manifest_path(graph).is_file() else {}
    manifest = write_manifest(
        target_path, stage="engine", parent=graph, config=asdict(config),
        backend={"name": backend.name, "version": backend.version}, target=asdict(target),
        compute_capability=spec["compute_capability"], build_machine=nvidia_smi(IDENTITY),
        precision=config.precision, recipe=recipe, calibration_key=recipe.get("calibration", {}).get("key"),
        mode=meta["mode"], steps=meta["steps"], profile_shapes=spec["shapes"], workspace_mib=spec["workspace_mib"],
        onnx_sha256=sha256_file(graph), build=build, estimated_build_mib=estimate, timings=stages.timings)
    return EngineResult(target_path, manifest, graph, build)
