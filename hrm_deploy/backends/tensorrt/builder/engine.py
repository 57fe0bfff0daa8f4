"""The TensorRT / TensorRT-RTX build: precision ONNX -> serialized engine + manifest + layers.json.

:data:`BUILDER` is the backend table's builder (:class:`hrm_deploy.engines.request.Builder`): it
refuses a missing TensorRT or a GPU too old for the precision before any work, asks for the
single-step graph when an unroll's build would be over budget (:mod:`.cost`), and builds the
precision graph the build stage made. The build runs in a child process (:mod:`.worker`); the
engine is written atomically and only when the requested precision is visibly in the network
(:mod:`.layers`).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from hrm_deploy.backends.tensorrt.api import load_backend
from hrm_deploy.backends.tensorrt.builder.cost import check_unrolled_build, compute_nodes, unrolled_over_budget
from hrm_deploy.backends.tensorrt.builder.layers import precision_verdict
from hrm_deploy.backends.tensorrt.builder.options import TensorRTOptions, reproduce_command, timing_cache_path
from hrm_deploy.engines.plan import MemoryPlan, build_estimate_mib, plan_graph
from hrm_deploy.engines.request import BuildRequest, GraphInput, StepInstead
from hrm_deploy.engines.result import EngineResult
from hrm_deploy.engines.targets import TargetProfile, target_architectures
from hrm_deploy.errors import ConfigError, EngineError
from hrm_deploy.io import check_output_path, sha256_bytes, staging_dir
from hrm_deploy.manifest import publish_artifact, read_verified
from hrm_deploy.onnx_runtime import load_onnx, load_onnx_bytes
from hrm_deploy.precision.registry import PRECISIONS
from hrm_deploy.progress import Stages
from hrm_deploy.system import gpu_identity

log = logging.getLogger(__name__)


class _Graph(NamedTuple):
    meta: dict[str, Any]  # hrm_deploy metadata
    dims: dict[str, list[Any]]  # input name -> dims, None for dynamic
    nodes: int
    compute_nodes: int  # without Cast and Q/DQ: what the build cost scales with (engines.cost)


@dataclass
class _Job:
    """One TensorRT build: the request, the verified graph bytes and what the build needs of them."""

    request: BuildRequest
    graph: Path
    onnx_bytes: bytes  # the graph's bytes, sha256-checked against its manifest
    graph_manifest: dict[str, Any] | None
    meta: dict[str, Any]  # the graph's hrm_deploy metadata
    spec: dict[str, Any]  # the worker's build spec (and the local facts, see _spec)
    backend: Any
    target_path: Path
    stages: Stages


def _graph_info(path: Path, data: bytes | None = None, model: Any = None) -> _Graph:
    """Metadata, input dims and node counts of the graph at ``path`` (from ``data``, its bytes, or
    ``model``, already parsed, where given; a file that does not parse is one line)."""
    from hrm_deploy.export.metadata import graph_metadata

    if model is None:
        model = load_onnx(path) if data is None else load_onnx_bytes(data, path)
    dims = {
        i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
        for i in model.graph.input
    }
    return _Graph(graph_metadata(model), dims, len(model.graph.node), compute_nodes(model))


def _shapes(dims: dict[str, list[Any]], lo: int, opt: int, hi: int) -> dict[str, list[list[int]]]:
    shapes = {}
    for name, d in dims.items():
        if any(x is None for x in d[1:]):
            raise EngineError(f"input {name} has a dynamic dimension besides the batch; re-export with fixed sizes")
        shapes[name] = [[b] + list(d[1:]) for b in (lo, opt, hi)]
    return shapes


def _check_memory_budget(target: TargetProfile, nodes: int, onnx_bytes: int) -> int:
    estimate = build_estimate_mib(nodes, onnx_bytes)
    if target.memory_budget_mib and estimate > target.memory_budget_mib * 0.75:
        raise EngineError(
            f"building this graph ({nodes} nodes) needs about {estimate} MiB of host memory, more than "
            f"{target.name}'s shared {target.memory_budget_mib} MiB allows; export the single-step graph "
            f"(hrm-deploy export --mode step) and build that"
        )
    return estimate


def _check_precision_took(precision: str, build: dict[str, Any]) -> str:
    """Fail when the requested precision is not visible in the network or the built engine.

    The network (strongly typed) must carry the precision. Where a GPU loaded the engine, the
    inspector's layers are read too (:mod:`hrm_deploy.backends.tensorrt.builder.layers`): refused only when every
    layer is detailed, unfused and none shows the precision; names-only inspector output and
    fused Myelin/ForeignNode layers are "cannot tell". Returns the engine verdict ("took",
    "cannot_tell", "not_inspected") and records it in ``build["engine_inspection"]``.
    """
    network = build.get("network", {})
    dtypes = network.get("output_dtypes", {})
    entry = PRECISIONS.get(precision)  # what the network must show, from the precision table
    missing = None
    if entry is not None and entry.calibrated and not network.get("qdq_layers"):
        missing = "no Q/DQ layers"
    elif entry is not None and entry.network_dtype and not dtypes.get(entry.network_dtype):
        missing = f"no layer computes in {precision.upper()} (no {entry.network_dtype} tensor in the network)"
    inspection = build.setdefault("engine_inspection", {})
    verdict = "not_inspected"
    if not missing and inspection.get("available"):
        verdict, why = precision_verdict(precision, inspection.get("summary", {}))
        inspection.update(verdict=verdict, why=why)
        if verdict == "fp32":
            missing = f"the built engine shows no {precision.upper()} tensor: {why}"
    if missing:
        raise EngineError(
            f"requested {precision} but {missing}; the engine was not written. Check the ONNX "
            "with `hrm-deploy inspect` and rebuild it from the FP32 export"
        )
    return verdict


def _check_can_strip(backend: Any, machine: dict[str, str]) -> None:
    """Weight-stripped (refittable) engines need a GPU at build time: TensorRT-RTX 1.7 on a CPU-only
    machine fails every REFIT, REFIT_IDENTICAL or STRIP_PLAN build in its CUDA check (measured)."""
    if backend.is_rtx and not machine:
        raise ConfigError(
            f"--strip-weights: {backend.name} {backend.version} builds weight-stripped engines only on a machine with "
            "an NVIDIA GPU (its refittable builds need CUDA); build on the GPU machine or the board (standard "
            "TensorRT on Jetson), or drop --strip-weights"
        )
    if not backend.supports_stripping():
        raise ConfigError(
            f"--strip-weights: {backend.name} {backend.version} has no STRIP_PLAN; use TensorRT 10.0 or newer"
        )


def _check_memory_plan(
    request: BuildRequest, model: Any, meta: dict[str, Any], graph: Path, spec: dict[str, Any]
) -> MemoryPlan | None:
    """On a target with a memory budget (Jetson): the engine's memory plan at the profile's batches,
    refused in one line naming what to change when the largest batch does not fit (``hrm-deploy plan``
    prints the whole plan). None for targets without a budget."""
    if not request.target.memory_budget_mib:
        return None
    plan = plan_graph(
        model,
        meta,
        request.target,
        request.config.precision,
        artifact=str(graph),
        max_batch=spec["shapes"][next(iter(spec["shapes"]))][2][0],
        puzzle_emb=str(meta.get("puzzle_emb", "embedded")),
    )
    if not plan.fits:
        raise ConfigError(plan.refusal() + f" (the whole plan: hrm-deploy plan {graph} --target {request.target.name})")
    return plan


def _plan_record(plan: MemoryPlan | None) -> dict[str, Any] | None:
    """The plan's summary for the manifest (MiB)."""
    if plan is None:
        return None
    last = plan.buckets[-1]
    return {
        "budget_mib": plan.budget_mib,
        "fixed_mib": round(plan.fixed / 2**20, 1),
        "max_batch": last.batch,
        "total_at_max_batch_mib": round(last.total / 2**20, 1),
        "largest_batch_that_fits": plan.largest_batch,
    }


def layers_path(engine_path: str | os.PathLike) -> Path:
    """``m.engine`` -> ``m.engine.layers.json``: the engine inspector's JSON (trt-engine-explorer reads it)."""
    engine_path = Path(engine_path)
    return engine_path.with_name(engine_path.name + ".layers.json")


def _die_with_parent() -> None:
    """In the worker, before exec: get SIGKILL when the parent dies (Linux prctl
    PR_SET_PDEATHSIG), so killing build-engine never leaves an orphaned builder running."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no prctl: the parent still kills the child on errors and Ctrl-C
        return
    if os.getppid() == 1:  # the parent already died between fork and prctl
        os._exit(1)


def _run_worker(
    spec: dict[str, Any], spec_file: Path, status: Callable[[str], None]
) -> subprocess.CompletedProcess[str]:
    """Run the build worker on ``spec`` (written to ``spec_file``) with its output captured; each
    line it writes to its progress pipe (parsing, the builder's phases) goes to ``status``."""
    read_fd, write_fd = os.pipe()

    def relay() -> None:
        with os.fdopen(read_fd, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                status(line.strip())

    reader = threading.Thread(target=relay, name="build-engine progress", daemon=True)
    reader.start()
    try:
        spec_file.write_text(json.dumps({**spec, "progress_fd": write_fd}))
        return subprocess.run(
            [sys.executable, "-m", "hrm_deploy.backends.tensorrt.builder.worker", str(spec_file)],
            check=False,
            capture_output=True,
            text=True,
            preexec_fn=_die_with_parent,
            pass_fds=(write_fd,),
        )
    finally:
        os.close(write_fd)  # the worker's copy is gone with it: the relay reads to the end and stops
        reader.join()


def _for_tensorrt(
    onnx_bytes: bytes, graph_manifest: dict[str, Any] | None, rewrites: dict[str, Any], strip: bool = False
) -> bytes:
    """The graph TensorRT parses: ``onnx_bytes`` with its static slices written as gathers
    (:func:`hrm_deploy.export.slicing.slices_to_gathers`: the same elements, bit for bit, but no
    shape layers in TensorRT's network: 6,700 -> 2,674 layers on the Sudoku-size step graph).
    Done here, not at export: ONNX Runtime's CPU Gather is ~3x slower than its Slice on the
    bundled model. Graphs with external weights are parsed as they are. ``rewrites`` records it."""
    if (graph_manifest or {}).get("companions"):
        rewrites["slices_to_gathers"] = "skipped: external weights"
        return onnx_bytes
    if strip:  # a weight-stripped engine refits from the graph as recorded: it must be the graph parsed
        rewrites["slices_to_gathers"] = "skipped: a weight-stripped engine refits from its recorded graph"
        return onnx_bytes
    import onnx

    from hrm_deploy.export.slicing import slices_to_gathers

    model, count = slices_to_gathers(onnx.load_from_string(onnx_bytes))
    rewrites["slices_to_gathers"] = count
    return model.SerializeToString() if count else onnx_bytes


class TensorRTBuilder:
    """Builds TensorRT and TensorRT-RTX engines (``build-engine --backend tensorrt|tensorrt-rtx``)
    from the precision graph the build stage made."""

    takes = GraphInput.PRECISION

    def preflight(self, request: BuildRequest) -> BuildRequest:
        """Before any conversion work: the flavour fits the target and is installed, and the
        target's GPUs run the precision (the architectures and this machine go to ``facts``)."""
        config, target = request.config, request.target
        asked = config.options_as(TensorRTOptions).compute_capability
        if request.backend not in target.backends:
            raise ConfigError(f"target {target.name} builds with {' or '.join(target.backends)}, not {request.backend}")
        if target.architectures or asked:  # GPUs the precision cannot run: before any package
            target_architectures(target, config.precision, asked)
        backend = load_backend(request.backend)
        backend.compute_capability(asked or target.compute_capability)  # validate early
        machine = gpu_identity()
        if config.options_as(TensorRTOptions).strip_weights:
            _check_can_strip(backend, machine)
        architectures = target_architectures(target, config.precision, asked, machine.get("compute_capability"))
        return replace(request, facts={**request.facts, "machine": machine, "architectures": architectures})

    def step_instead(self, graph: Path, request: BuildRequest) -> StepInstead | None:
        """The single-step graph when ``graph`` is an unroll whose build is over budget and
        ``--allow-unrolled`` was not given (:mod:`.cost`)."""
        given = _graph_info(graph, model=request.model if graph == request.source else None)
        over = unrolled_over_budget(given.meta, given.compute_nodes, request.config.precision)
        if over is None or request.config.options_as(TensorRTOptions).allow_unrolled:
            return None
        why = (
            f"{graph.name} is a {given.meta.get('steps', '?')}-step unrolled graph whose TensorRT build would take "
            f"{over.describe()}: building its single-step graph instead, run by the device loop "
            "(--allow-unrolled builds the unroll)"
        )
        return StepInstead(why, {"unrolled_graph": str(graph), "unrolled_estimate": over.to_dict()})

    def build(self, request: BuildRequest) -> EngineResult:
        """The engine of ``request.ready`` (the precision graph), its manifest and layers.json."""
        config, target, graph = request.config, request.target, request.ready
        # Everything below uses these bytes, whose sha256 matched the manifest: a concurrent export
        # replacing the file cannot slip in between the check, the shapes and the build.
        onnx_bytes, graph_manifest = read_verified(graph)
        model = load_onnx_bytes(onnx_bytes, graph)
        meta, dims, nodes, compute = _graph_info(graph, model=model)
        allow = config.options_as(TensorRTOptions).allow_unrolled
        unrolled_cost = check_unrolled_build(meta, compute, config.precision, allow, graph.name)
        if unrolled_cost is not None and not request.quiet:
            log.info(f"building the unrolled graph as asked (--allow-unrolled): {unrolled_cost.describe()}")
        backend = load_backend(request.backend)
        spec = {**_spec(request, backend, dims, len(onnx_bytes), nodes), "onnx_sha256": sha256_bytes(onnx_bytes)}
        plan = _check_memory_plan(request, model, meta, graph, spec)
        stem = graph.name[: -len(".onnx")]
        out = request.out or Path("engines") / f"{stem}.{target.name}.{backend.name}.engine"
        target_path = check_output_path(out)
        job = _Job(request, graph, onnx_bytes, graph_manifest, meta, spec, backend, target_path, Stages(request.quiet))
        with staging_dir(target_path.parent, "build") as work:
            staged, build = _build_in_child(job, work)
            _check_precision_took(config.precision, build)
            facts = {**request.facts, "unrolled_opt_in": unrolled_cost.to_dict() if unrolled_cost else None}
            facts["memory_plan"] = _plan_record(plan)
            manifest = _publish(job, staged, build, facts)
        return EngineResult(target_path, manifest, graph, build)


def _spec(request: BuildRequest, backend: Any, dims: dict[str, list[Any]], onnx_bytes: int, nodes: int) -> dict:
    """The worker's build spec: the batch profile, workspace, optimization level, compute
    capability and timing cache, each from the options or the target's profile."""
    config, target = request.config, request.target
    options = config.options_as(TensorRTOptions)
    estimate = _check_memory_budget(target, nodes, onnx_bytes)
    lo = config.min_batch or target.min_batch
    hi = config.max_batch or target.max_batch
    opt = config.opt_batch or min(max(target.opt_batch, lo), hi)
    if not lo <= opt <= hi:
        raise ConfigError(f"batch profile needs min <= opt <= max, got {lo}/{opt}/{hi}")
    machine = request.facts.get("machine", {})
    return {
        "backend": backend.name,
        "version": backend.version,
        "shapes": _shapes(dims, lo, opt, hi),
        "workspace_mib": options.workspace_mib or target.workspace_mib,
        "optimization_level": options.optimization_level
        if options.optimization_level is not None
        else target.builder_optimization_level,
        "compute_capability": options.compute_capability or target.compute_capability,
        "timing_cache": str(timing_cache_path(options.timing_cache, backend, machine))
        if options.timing_cache and backend.supports_timing_cache()
        else None,
        "estimated_build_mib": estimate,
        "nodes": nodes,
        "strip_weights": options.strip_weights,
    }


def _build_in_child(job: _Job, work: Path) -> tuple[Path, dict[str, Any]]:
    """Stage the parsed copy of the graph in ``work``, run the worker on it; returns the staged
    engine and the worker's build report (``spec`` gets the staged paths and the graph rewrites)."""
    graph, spec, request = job.graph, job.spec, job.request
    spec["rewrites"] = {}
    built_from = work / graph.name
    built_from.write_bytes(_for_tensorrt(job.onnx_bytes, job.graph_manifest, spec["rewrites"], spec["strip_weights"]))
    for companion in (job.graph_manifest or {}).get("companions", {}) or {}:
        os.symlink(graph.resolve().with_name(companion), work / companion)  # checked by read_verified
    staged = work / job.target_path.name
    spec_file, result_file = work / "spec.json", work / "result.json"
    spec.update(
        onnx=str(built_from.resolve()), out=str(staged), result=str(result_file), layers_out=str(work / "layers.json")
    )
    if spec["timing_cache"]:
        Path(spec["timing_cache"]).parent.mkdir(parents=True, exist_ok=True)
    backend = spec["backend"]
    local = ("version", "rewrites", "estimated_build_mib", "nodes", "onnx_sha256")  # not the worker's
    worker_spec = {k: v for k, v in spec.items() if k not in local}
    with job.stages.stage(
        f"building {request.config.precision} engine with {backend} {spec['version']} "
        f"for {request.target.name} ({spec['nodes']} ONNX nodes, in a child process)"
    ) as status:
        child = _run_worker(worker_spec, spec_file, status)
    build = json.loads(result_file.read_text()) if result_file.is_file() else {}
    if child.returncode != 0:
        if build.get("parser_errors"):
            raise EngineError(f"{backend} could not parse {graph.name}:\n  " + "\n  ".join(build["parser_errors"]))
        tail = "\n".join((child.stderr or child.stdout).strip().splitlines()[-8:])
        raise EngineError(f"{backend} failed to build {graph.name} (exit {child.returncode}):\n{tail}")
    return staged, build


def _publish(job: _Job, staged: Path, build: dict[str, Any], facts: dict[str, Any]) -> Path:
    """Engine + layers.json + manifest as one unit: layers.json renamed in before the engine, a
    previous build's layers (describing another engine) removed. Returns the manifest path."""
    config, spec, target_path, backend = job.request.config, job.spec, job.target_path, job.backend
    layers_file = layers_path(target_path)
    have_layers = Path(spec["layers_out"]).is_file()
    recipe = (job.graph_manifest or {}).get("report", {})
    return publish_artifact(
        staged,
        target_path,
        stage="engine",
        parent=job.graph,
        parent_sha256=spec["onnx_sha256"],
        config=config.record(),
        sidecars=[(Path(spec["layers_out"]), layers_file)] if have_layers else [],
        remove=[] if have_layers else [layers_file],
        backend={"name": backend.name, "version": backend.version},
        target=asdict(job.request.target),
        compute_capability=spec["compute_capability"],
        architectures=facts.get("architectures"),
        build_machine=facts.get("machine"),
        precision=config.precision,
        recipe=recipe,
        calibration_key=recipe.get("calibration", {}).get("key"),
        mode=job.meta["mode"],
        steps=job.meta["steps"],
        profile_shapes=spec["shapes"],
        workspace_mib=spec["workspace_mib"],
        onnx_sha256=spec["onnx_sha256"],
        graph_rewrites=spec["rewrites"],  # applied to the parsed copy only (bit-exact, see _for_tensorrt)
        build=build,
        estimated_build_mib=spec["estimated_build_mib"],
        unrolled_opt_in=facts.get("unrolled_opt_in"),
        memory_plan=facts.get("memory_plan"),
        step_instead_of_unrolled=facts.get("step_instead_of_unrolled"),
        timings=job.stages.timings,
        trtexec_command=reproduce_command(
            backend,
            onnx=job.graph,
            engine=target_path,
            shapes=spec["shapes"],
            workspace_mib=spec["workspace_mib"],
            optimization_level=spec["optimization_level"],
            compute_capability=spec["compute_capability"],
            timing_cache=spec["timing_cache"],
            strip_weights=spec["strip_weights"],
        ),
        layers_json=layers_file.name if have_layers else None,
        timing_cache=spec["timing_cache"],
        weights_stripped=spec["strip_weights"],
        # what a stripped engine refits from on first run: the graph parsed, by sha256 (refit.py)
        refit_source={"path": os.path.relpath(job.graph, target_path.parent), "sha256": spec["onnx_sha256"]}
        if spec["strip_weights"]
        else None,
    )


BUILDER = TensorRTBuilder()
