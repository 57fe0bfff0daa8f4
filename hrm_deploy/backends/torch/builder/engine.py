"""The PyTorch engine (``build-engine --backend torch``): an AOTInductor package (``.pt2``) of
the single ACT step (step mode), of the whole unroll or of the ACT loop, with a dynamic batch,
compiled for this machine's GPU (or for the CPU where there is none), plus a manifest like
every engine.

It is a deployment artifact for NVIDIA GPUs without TensorRT, and it runs through the same
engine adapter and device loop as TensorRT engines (one stream, preallocated buffers, the
step loop captured as a CUDA graph). Where AOTInductor cannot compile (no host compiler or
no CUDA headers), the exported program is saved instead and the runner compiles it with
``torch.compile`` at load; the manifest's ``compile_path`` says which (``aoti`` or
``torch.compile``) and why.

The build has the shape of every builder's: a preflight (:func:`plan`: options, source and
output checked before any work), the build (:func:`compile_engine`: load, bf16 rebuild,
``torch.export``, compile, load probe; :mod:`.compile`) and the publish (:func:`publish`: the
manifest and the package moved into place as one unit). :data:`BUILDER` is the backend table's
builder; :func:`build_torch_engine` the same three steps from Python. Both read one config, an
``EngineConfig`` whose options are a :class:`~.options.TorchOptions` (device, TF32, mode, steps,
compiler).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hrm_deploy.backends.torch.builder.compile import (
    Traced,
    compile_program,
    io_specs,
    load_check,
    program_path,
    trace,
)
from hrm_deploy.backends.torch.builder.options import DEFAULT_MAX_BATCH, TORCH_PRECISIONS, TorchOptions
from hrm_deploy.engines.config import EngineConfig
from hrm_deploy.engines.request import BuildRequest, GraphInput, StepInstead
from hrm_deploy.engines.result import EngineResult
from hrm_deploy.errors import ArtifactError, ConfigError, require
from hrm_deploy.io import sha256_file, staging_dir
from hrm_deploy.manifest import publish_artifact
from hrm_deploy.progress import Stages


@dataclass(frozen=True)
class Plan:
    """One torch build, checked before any work: the source and its checkpoint, the graph's
    metadata ({} for a checkpoint), the device it compiles for and where the package goes."""

    source: Path
    checkpoint: Path
    meta: dict[str, Any]
    config: EngineConfig
    device: str  # "cpu", "cuda" or "cuda:N", resolved
    target: Path
    stages: Stages

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def options(self) -> TorchOptions:
        return self.config.options_as(TorchOptions)

    @property
    def max_batch(self) -> int:
        """The package's largest batch: --max-batch, else :data:`DEFAULT_MAX_BATCH`."""
        return self.config.max_batch or DEFAULT_MAX_BATCH


@dataclass(frozen=True)
class Built:
    """What the build step made in the staging folder: the package (or the saved program) and
    what the manifest records of it."""

    staged: Path
    model_config: Any
    mode: str
    steps: int
    traced: Traced
    io: list[dict[str, Any]]
    compile_path: str
    fallback_reason: str | None
    checks: dict[str, Any]  # the load probe's record and companions ({}: not an AOTInductor package)
    seconds: float


def resolve_device(torch: Any, device: str, tf32: bool) -> str:
    """``device`` with "auto" resolved (cuda when torch sees a GPU), refused where this machine cannot
    compile for it; TF32 only for CUDA engines."""
    resolved = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if resolved.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda but torch sees no CUDA GPU here; build for cpu or on the GPU machine")
    if tf32 and not resolved.startswith("cuda"):
        raise ConfigError(
            "--tf32 applies to CUDA engines (float32 matmuls on the GPU); this build is for the CPU: drop --tf32"
        )
    return resolved


def _source(source: Path) -> tuple[Path, dict[str, Any]]:
    """(checkpoint, graph metadata or {}) for an ONNX export or a checkpoint given directly."""
    from hrm_deploy.artifacts import find_reference, is_checkpoint

    if not source.exists():
        raise ArtifactError(f"{source} does not exist")
    if is_checkpoint(source):
        return source, {}
    if source.suffix != ".onnx":
        raise ArtifactError(f"{source} is neither an ONNX export nor a checkpoint; pass one of them")
    onnx = require("onnx", "onnx", "Reading the ONNX export's metadata")
    from hrm_deploy.export.metadata import graph_metadata

    # the checkpoint the ONNX came from, its sha256 checked against the ONNX manifest
    return find_reference(source), graph_metadata(onnx.load(str(source), load_external_data=False))


def plan(
    torch: Any, source: str | os.PathLike, config: EngineConfig, out: str | os.PathLike | None, quiet: bool
) -> Plan:
    """The preflight: the source (an ONNX export: its parent checkpoint; or a checkpoint), an FP32
    graph, the device and the output name, all checked before any loading or compiling."""
    from hrm_deploy.export.onnx_export import default_name

    src = Path(source)
    checkpoint, meta = _source(src)
    if meta.get("precision", "fp32") != "fp32":
        raise ConfigError(
            f"{src} is a {meta['precision']} graph; build the torch engine from the FP32 export "
            "(or the checkpoint) and choose --fp32 or --bf16"
        )
    options = config.options_as(TorchOptions)
    device = resolve_device(torch, options.device, options.tf32)
    mode = options.mode or meta.get("mode", "step")
    # named after the export, or for a checkpoint as an export of it would be (<run>-step_N, the Hub repository)
    stem = src.name.removesuffix(".onnx") if src.suffix == ".onnx" else default_name(src)
    target = Path(out) if out else Path("engines") / f"{stem}.{mode}.{device.split(':')[0]}.torch.pt2"
    if target.suffix != ".pt2":
        raise ConfigError(f"a torch engine's file name must end in .pt2 (the runner table reads it): {target}")
    return Plan(src, checkpoint, meta, config, device, target, Stages(quiet))


def compile_engine(torch: Any, job: Plan, work: Path) -> Built:
    """The build, into the staging folder ``work``: the checkpoint loaded (rebuilt in bfloat16 for
    bf16), the mode's module exported, compiled, and an AOTInductor package's load probed."""
    from hrm_deploy.engines.result import recorded_data_fields
    from hrm_deploy.model.checkpoint import load_checkpoint

    config, options, stages, src = job.config, job.options, job.stages, job.source
    with stages.stage(f"loading {job.checkpoint.name}"):
        # an ONNX export's checkpoint is loaded as it was exported (an upstream checkpoint without its
        # dataset.json needs the sizes the export was given)
        model, model_config = load_checkpoint(
            job.checkpoint, **(recorded_data_fields(src) if src != job.checkpoint else {})
        )
    if config.precision == "bf16":  # the same weights in a model whose forward runs in bfloat16
        state = model.state_dict()
        model = type(model)(model_config.replace(forward_dtype=TORCH_PRECISIONS["bf16"])).eval()
        model.load_state_dict(state)
        model_config = model.inner.config
    mode = options.mode or job.meta.get("mode", "step")
    steps = int(options.steps or job.meta.get("steps") or model_config.halt_max_steps)
    started = time.perf_counter()
    what = {"step": "the single step", "loop": f"the ACT loop (torch.while_loop, at most {steps} steps)"}.get(
        mode, f"the {steps}-step unroll"
    )
    with stages.stage(f"torch.export of {what}"):
        traced = trace(torch, model, job.meta, mode, steps, job.device, job.max_batch)
    staged = work / "engine.pt2"
    tf32 = options.tf32 and job.cuda
    compile_path, reason = compile_program(
        torch, traced.program, staged, options.compiler, tf32, job.device, stages, stages.quiet
    )
    io = io_specs(mode, model_config, steps, traced.dtypes)
    checks = {}
    if compile_path == "aoti":
        with stages.stage("loading the package in a fresh process"):
            checks = load_check(torch, traced.program, staged, job.target, job.device, tf32, io, job.max_batch)
    seconds = time.perf_counter() - started
    return Built(staged, model_config, mode, steps, traced, io, compile_path, reason, checks, seconds)


def publish(torch: Any, job: Plan, built: Built) -> EngineResult:
    """The package, its companions and its manifest moved into place as one unit."""
    from hrm_deploy.system import gpu_identity

    gpu = gpu_identity() if job.cuda else {}
    if job.cuda:
        cap = torch.cuda.get_device_capability(torch.device(job.device))
        gpu = {
            **gpu,
            "gpu": torch.cuda.get_device_name(torch.device(job.device)),
            "compute_capability": f"{cap[0]}.{cap[1]}",
        }
    config, checks, halt = job.config, built.checks, built.traced.halt
    engine_bytes = built.staged.stat().st_size
    manifest = publish_artifact(
        built.staged,
        job.target,
        stage="engine",
        parent=job.source,
        config={**config.record(), "max_batch": job.max_batch},
        backend={"name": "torch", "version": torch.__version__},
        precision=config.precision,
        mode=built.mode,
        steps=built.steps,
        halt=halt.to_dict() if halt is not None else None,
        device=job.device.split(":")[0],
        compile_path=built.compile_path,
        compile_fallback_reason=built.fallback_reason,
        tf32=job.options.tf32 and job.cuda,
        companions=checks.get("companions", []),
        remove=[] if checks else [program_path(job.target)],  # an older build's, when this one has none
        load_check=checks.get("load_check"),
        load_fallback=checks.get("load_fallback"),
        checkpoint={"path": str(job.checkpoint), "sha256": sha256_file(job.checkpoint)},
        compute_capability=None,
        build_machine=gpu,
        profile_shapes={"batch": [1, job.max_batch]},
        io=built.io,
        model_config=asdict(built.model_config),
        build_seconds=built.seconds,
        timings=job.stages.timings,
    )
    build = {
        "build_seconds": built.seconds,
        "engine_bytes": engine_bytes,
        "compile_path": built.compile_path,
        "load_check": checks.get("load_check"),
    }
    return EngineResult(job.target, manifest, job.source, build)


def build_torch_engine(
    source: str | os.PathLike, config: EngineConfig, out: str | os.PathLike | None = None, quiet: bool = False
) -> EngineResult:
    """Compile ``source`` (an ONNX export: its parent checkpoint; or a checkpoint) into a PyTorch
    engine as ``config`` says (``--backend torch``: its options a :class:`TorchOptions`): preflight,
    build, publish."""
    torch = require("torch", "torch", "The PyTorch engine")
    job = plan(torch, source, config, out, quiet)
    job.target.parent.mkdir(parents=True, exist_ok=True)
    with staging_dir(job.target.parent, "torch-engine") as work:
        return publish(torch, job, compile_engine(torch, job, Path(work)))


class TorchBuilder:
    """Builds PyTorch AOTInductor engines (``build-engine --backend torch``) from what was given,
    an export or a checkpoint: it compiles the model itself."""

    takes = GraphInput.SOURCE

    def preflight(self, request: BuildRequest) -> BuildRequest:
        """Before the source is read: torch is installed, the precision is one it compiles and this
        machine can compile for the device (the resolved device goes to ``facts``)."""
        torch = require("torch", "torch", "The PyTorch engine")
        options = request.config.options_as(TorchOptions)
        device = resolve_device(torch, options.device, options.tf32)
        return replace(request, facts={**request.facts, "device": device})

    def step_instead(self, graph: Path, request: BuildRequest) -> StepInstead | None:
        return None  # the model is compiled whole, never parsed from an ONNX graph

    def build(self, request: BuildRequest) -> EngineResult:
        """The engine of ``request.ready`` (an export or a checkpoint) and its manifest."""
        return build_torch_engine(request.ready, request.config, request.out, request.quiet)


BUILDER = TorchBuilder()
