"""The PyTorch engine (``build-engine --backend torch``): an AOTInductor package (``.pt2``) of
the single ACT step (step mode) or of the whole unroll, with a dynamic batch, compiled for
this machine's GPU (or for the CPU where there is none), plus a manifest like every engine.

It is a deployment artifact for NVIDIA GPUs without TensorRT, and it runs through the same
engine adapter and device loop as TensorRT engines (one stream, preallocated buffers, the
step loop captured as a CUDA graph). Where AOTInductor cannot compile (no host compiler or
no CUDA headers), the exported program is saved instead and the runner compiles it with
``torch.compile`` at load; the manifest's ``compile_path`` says which (``aoti`` or
``torch.compile``) and why.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hrm_deploy.backends.torch.package import tf32_matmuls
from hrm_deploy.errors import ArtifactError, ConfigError, EngineError, require
from hrm_deploy.io import sha256_file, staging_dir
from hrm_deploy.manifest import publish_artifact
from hrm_deploy.progress import Stages

log = logging.getLogger(__name__)

TORCH_PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}
COMPILERS = ("auto", "aoti", "torch.compile")


@dataclass(frozen=True)
class TorchEngineConfig:
    """``mode``/``steps`` default to the ONNX graph's (or step mode and the checkpoint's
    ``halt_max_steps`` for a checkpoint); ``device`` "auto" is cuda when torch sees a GPU;
    ``tf32`` lets float32 CUDA matmuls use TF32 (default: exact float32)."""

    precision: str = "fp32"
    mode: str | None = None
    steps: int | None = None
    device: str = "auto"
    max_batch: int = 1024
    compiler: str = "auto"
    tf32: bool = False  # float32 CUDA matmuls in TF32 (faster, ~1e-3 relative error); recorded in the manifest

    def __post_init__(self) -> None:
        if self.precision not in TORCH_PRECISIONS:
            raise ConfigError(
                f"the torch backend builds {' or '.join(TORCH_PRECISIONS)}, not {self.precision}; pass --fp32 or --bf16"
            )
        if self.mode not in (None, "step", "unrolled", "loop"):
            raise ConfigError(f"mode {self.mode!r}: use step, unrolled or loop")
        if self.compiler not in COMPILERS:
            raise ConfigError(f"compiler {self.compiler!r}: use one of {', '.join(COMPILERS)}")
        if self.max_batch < 2:
            raise ConfigError("max_batch must be >= 2")


def io_specs(mode: str, config: Any, steps: int, dtypes: list[str] | None = None) -> list[dict[str, Any]]:
    """The engine's I/O tensors (name, input?, dtype, shape with -1 for the batch), in call order,
    from the graphs' contract (step predictions always, unrolled); ``dtypes`` (inputs then
    outputs, as traced) replace the contract's defaults."""
    from hrm_deploy.contract import graph_io

    S, V, T, D = config.seq_len, config.vocab_size, config.total_seq_len, config.hidden_size
    io = graph_io(mode, S, T, D, V, steps, step_predictions=True)
    return [
        {
            "name": t.name,
            "is_input": t.is_input,
            "dtype": dtypes[k] if dtypes else t.dtype,
            "shape": [-1 if d == "batch" else d for d in t.shape],
        }
        for k, t in enumerate(io)
    ]


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


def build_torch_engine(
    source: str | os.PathLike, config: TorchEngineConfig, out: str | os.PathLike | None = None, quiet: bool = False
) -> Any:
    """Compile ``source`` (an ONNX export: its parent checkpoint; or a checkpoint) into a PyTorch
    engine; returns an :class:`hrm_deploy.engines.result.EngineResult`."""
    torch = require("torch", "torch", "The PyTorch engine")
    from hrm_deploy.engines.result import EngineResult, recorded_data_fields
    from hrm_deploy.export.onnx_export import default_name
    from hrm_deploy.export.unroll import single_step, unroll
    from hrm_deploy.model.checkpoint import load_checkpoint
    from hrm_deploy.system import gpu_identity

    src = Path(source)
    checkpoint, meta = _source(src)
    if meta.get("precision", "fp32") != "fp32":
        raise ConfigError(
            f"{src} is a {meta['precision']} graph; build the torch engine from the FP32 export "
            "(or the checkpoint) and choose --fp32 or --bf16"
        )
    device = ("cuda" if torch.cuda.is_available() else "cpu") if config.device == "auto" else config.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda but torch sees no CUDA GPU here; build for cpu or on the GPU machine")
    if config.tf32 and not device.startswith("cuda"):
        raise ConfigError(
            "--tf32 applies to CUDA engines (float32 matmuls on the GPU); this build is for the CPU: drop --tf32"
        )
    stages = Stages(quiet)
    with stages.stage(f"loading {checkpoint.name}"):
        # an ONNX export's checkpoint is loaded as it was exported (an upstream checkpoint without its
        # dataset.json needs the sizes the export was given)
        model, model_config = load_checkpoint(checkpoint, **(recorded_data_fields(src) if src != checkpoint else {}))
    if config.precision == "bf16":
        state = model.state_dict()
        model = type(model)(model_config.replace(forward_dtype="bfloat16")).eval()
        model.load_state_dict(state)
        model_config = model.inner.config
    mode = config.mode or meta.get("mode", "step")
    steps = int(config.steps or meta.get("steps") or model_config.halt_max_steps)
    halt = None
    module: Any
    if mode == "loop":  # the loop export's rule, as one torch.while_loop (a device loop, early exit)
        from hrm_deploy.export.loop import LoopHalt
        from hrm_deploy.export.unroll import LoopHRM

        halt = LoopHalt.parse(meta.get("halt", "off"), q_halt_only=model_config.halts_on_q_halt_alone)
        module = LoopHRM(model, halt, steps).to(device)
    else:
        module = (single_step(model) if mode == "step" else unroll(model, steps, step_predictions=True)).to(device)
    batch, S, T, D = 2, model_config.seq_len, model_config.total_seq_len, model_config.hidden_size
    args: tuple[Any, ...] = (
        torch.zeros(batch, S, dtype=torch.int32, device=device),
        torch.zeros(batch, dtype=torch.int32, device=device),
    )
    if mode == "step":
        carry = torch.zeros(batch, T, D, device=device)
        with torch.inference_mode():  # the carry's dtype is whatever the step returns (bf16 models: bf16)
            carry = carry.to(module(*args, carry, carry, torch.ones(batch, dtype=torch.bool, device=device))[0].dtype)
        args += (carry, carry.clone(), torch.ones(batch, dtype=torch.bool, device=device))
    with torch.inference_mode():
        dtypes = [str(t.dtype).removeprefix("torch.") for t in (*args, *module(*args))]
    dim = torch.export.Dim("batch", min=1, max=config.max_batch)
    dynamic = tuple({0: dim} for _ in args)
    # named after the export, or for a checkpoint as an export of it would be (<run>-step_N, the Hub repository)
    stem = src.name.removesuffix(".onnx") if src.suffix == ".onnx" else default_name(src)
    target = Path(out) if out else Path("engines") / f"{stem}.{mode}.{device.split(':')[0]}.torch.pt2"
    if target.suffix != ".pt2":
        raise ConfigError(f"a torch engine's file name must end in .pt2 (the runner table reads it): {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    what = {"step": "the single step", "loop": f"the ACT loop (torch.while_loop, at most {steps} steps)"}.get(
        mode, f"the {steps}-step unroll"
    )
    with stages.stage(f"torch.export of {what}"), torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.export's own deprecation chatter
        program = torch.export.export(module, args, dynamic_shapes=dynamic)
    with staging_dir(target.parent, "torch-engine") as work:
        built = Path(work) / "engine.pt2"
        compile_path, fallback_reason = _compile(torch, program, built, config, device, stages, quiet)
        io = io_specs(mode, model_config, steps, dtypes)
        checks = {}
        if compile_path == "aoti":
            with stages.stage("loading the package in a fresh process"):
                checks = _load_check(torch, program, built, target, device, config, io)
        seconds = time.perf_counter() - started
        engine_bytes = built.stat().st_size
        gpu = gpu_identity() if device.startswith("cuda") else {}
        if device.startswith("cuda"):
            cap = torch.cuda.get_device_capability(torch.device(device))
            gpu = {
                **gpu,
                "gpu": torch.cuda.get_device_name(torch.device(device)),
                "compute_capability": f"{cap[0]}.{cap[1]}",
            }
        manifest = publish_artifact(  # engine + manifest into place as one unit
            built,
            target,
            stage="engine",
            parent=src,
            config=asdict(config),
            backend={"name": "torch", "version": torch.__version__},
            precision=config.precision,
            mode=mode,
            steps=steps,
            halt=halt.to_dict() if halt is not None else None,
            device=device.split(":")[0],
            compile_path=compile_path,
            compile_fallback_reason=fallback_reason,
            tf32=config.tf32 and device.startswith("cuda"),
            companions=checks.get("companions", []),
            remove=[] if checks else [_program_path(target)],  # an older build's, when this one has none
            load_check=checks.get("load_check"),
            load_fallback=checks.get("load_fallback"),
            checkpoint={"path": str(checkpoint), "sha256": sha256_file(checkpoint)},
            compute_capability=None,
            build_machine=gpu,
            profile_shapes={"batch": [1, config.max_batch]},
            io=io,
            model_config=asdict(model_config),
            build_seconds=seconds,
            timings=stages.timings,
        )
    return EngineResult(
        target,
        manifest,
        src,
        {
            "build_seconds": seconds,
            "engine_bytes": engine_bytes,
            "compile_path": compile_path,
            "load_check": checks.get("load_check"),
        },
    )


def _compile(
    torch: Any, program: Any, built: Path, config: TorchEngineConfig, device: str, stages: Stages, quiet: bool
) -> tuple[str, str | None]:
    """AOTInductor-compile ``program`` into ``built``, or save the exported program there where it
    cannot (with ``compiler`` auto); returns (compile_path, why it fell back or None)."""
    with warnings.catch_warnings(), tf32_matmuls(torch, config.tf32 and device.startswith("cuda")):
        warnings.simplefilter("ignore", FutureWarning)
        try:
            if config.compiler == "torch.compile":
                raise RuntimeError("torch.compile was asked for")
            with stages.stage(f"AOTInductor compile for {device}"):
                torch._inductor.aoti_compile_and_package(program, package_path=str(built))
            return "aoti", None
        except Exception as exc:  # noqa: BLE001 - a missing host compiler / CUDA headers surface as many types
            if config.compiler == "aoti":
                raise EngineError(
                    f"AOTInductor could not compile for {device}: {str(exc).splitlines()[0][:300]}; "
                    "install a host compiler (gcc) and the CUDA headers, or use --compiler auto"
                ) from None
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            if not quiet and config.compiler == "auto":
                log.warning(
                    f"AOTInductor could not compile ({reason}); saving the exported program, the runner "
                    "will torch.compile it"
                )
            torch.export.save(program, str(built))
            return "torch.compile", reason


def _program_path(target: Path) -> Path:
    """Where the exported program is saved beside an AOTInductor package (not ``.pt2``: the
    suffix table would read it as an engine)."""
    return target.with_name(target.name + ".program")


def _load_check(
    torch: Any,
    program: Any,
    built: Path,
    target: Path,
    device: str,
    config: TorchEngineConfig,
    io: list[dict[str, Any]],
) -> dict[str, Any]:
    """For an AOTInductor package: its exported program saved beside it as the load fallback, and
    the package loaded by a child process with the options a captured loop uses (the verdict
    is cached, so the first runner here reads it). A package that cannot be loaded is reported
    now, in one warning line, and recorded."""
    from hrm_deploy.backends.torch.probe import ProbeSpec, probe_load
    from hrm_deploy.io import sha256_file

    staged_program = built.with_name("engine.program")
    with open(staged_program, "wb") as f:
        torch.export.save(program, f)
    cuda = device.startswith("cuda")
    index = (torch.device(device).index or 0) if cuda else -1
    spec = ProbeSpec(
        path=str(built.resolve()),
        device="cuda" if cuda else "cpu",
        device_index=index,
        single_threaded=cuda,
        tf32=config.tf32 and cuda,
        io=io,
        max_batch=config.max_batch,
        capture=cuda,
    )
    label = f"cuda {torch.cuda.get_device_name(index)}" if cuda else "cpu"
    verdict = probe_load(spec, sha256=sha256_file(built), torch_version=torch.__version__, device_label=label)
    if not verdict.ok:
        log.warning(
            "the built package cannot be loaded by a fresh process here (%s); runners will use the exported "
            "program saved beside it (%s) under torch.compile",
            verdict.reason,
            _program_path(target).name,
        )
    return {
        "companions": [(staged_program, _program_path(target))],
        "load_check": verdict.record(),
        "load_fallback": _program_path(target).name,
    }


def build_from_config(
    source: str | os.PathLike | None, config: Any, out: str | os.PathLike | None = None, quiet: bool = False
) -> Any:
    """``build-engine --backend torch``: the engine stage's options (an ``EngineConfig``) as a
    PyTorch engine for this machine; ``source`` is an ONNX export or a checkpoint (default: the
    newest export)."""
    from hrm_deploy.engines.result import newest_export

    torch_config = TorchEngineConfig(
        precision=config.precision,
        max_batch=config.max_batch or 1024,
        device=config.device,
        tf32=bool(getattr(config, "tf32", False)),
    )
    return build_torch_engine(source or newest_export(), torch_config, out, quiet=quiet)


def _build(request: Any) -> Any:
    return build_from_config(request.ready, request.config, request.out, request.quiet)


def _builder() -> Any:
    """The backend table's builder: it compiles the model itself, from the export or checkpoint given."""
    from hrm_deploy.engines.request import GraphInput, SimpleBuilder

    return SimpleBuilder(_build, GraphInput.SOURCE)


BUILDER = _builder()
