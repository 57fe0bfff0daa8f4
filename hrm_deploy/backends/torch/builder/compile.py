"""The torch build's work steps: the module of a mode (step, unroll or the ACT loop) traced by
``torch.export`` with a dynamic batch, compiled by AOTInductor (or saved for ``torch.compile``
where it cannot), and the package's load checked in a fresh process; plus the engine's I/O."""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hrm_deploy.backends.torch.package import tf32_matmuls
from hrm_deploy.errors import EngineError
from hrm_deploy.progress import Stages

log = logging.getLogger(__name__)


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


@dataclass(frozen=True)
class Traced:
    """``torch.export``'s program of one mode, its halting rule (loop mode) and its I/O dtypes."""

    program: Any
    halt: Any  # export.loop.LoopHalt in loop mode, else None
    dtypes: list[str]  # inputs then outputs, as traced


def trace(torch: Any, model: Any, meta: dict[str, Any], mode: str, steps: int, device: str, max_batch: int) -> Traced:
    """``model`` as the module of ``mode`` on ``device`` (loop: the export's halting rule as one
    ``torch.while_loop``), exported with a dynamic batch of 1..``max_batch``."""
    from hrm_deploy.export.unroll import single_step, unroll

    config = model.inner.config
    halt = None
    module: Any
    if mode == "loop":  # the loop export's rule, as one torch.while_loop (a device loop, early exit)
        from hrm_deploy.export.loop import LoopHalt
        from hrm_deploy.export.unroll import LoopHRM

        halt = LoopHalt.parse(meta.get("halt", "off"), q_halt_only=config.halts_on_q_halt_alone)
        module = LoopHRM(model, halt, steps).to(device)
    else:
        module = (single_step(model) if mode == "step" else unroll(model, steps, step_predictions=True)).to(device)
    batch, S, T, D = 2, config.seq_len, config.total_seq_len, config.hidden_size  # (B, S) tokens, (B, T, D) carry
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
    dim = torch.export.Dim("batch", min=1, max=max_batch)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.export's own deprecation chatter
        program = torch.export.export(module, args, dynamic_shapes=tuple({0: dim} for _ in args))
    return Traced(program, halt, dtypes)


def compile_program(
    torch: Any, program: Any, built: Path, compiler: str, tf32: bool, device: str, stages: Stages, quiet: bool
) -> tuple[str, str | None]:
    """AOTInductor-compile ``program`` into ``built``, or save the exported program there for the
    runner to ``torch.compile`` (``compiler`` "torch.compile", or "auto" where AOTInductor cannot);
    returns (compile_path, why the program was saved instead of compiled, or None)."""
    with warnings.catch_warnings(), tf32_matmuls(torch, tf32):
        warnings.simplefilter("ignore", FutureWarning)
        if compiler == "torch.compile":
            reason = "compiler torch.compile was chosen"
        else:
            try:
                with stages.stage(f"AOTInductor compile for {device}"):
                    torch._inductor.aoti_compile_and_package(program, package_path=str(built))
                return "aoti", None
            except Exception as exc:  # noqa: BLE001 - a missing host compiler / CUDA headers surface as many types
                first_line = str(exc).splitlines()[0][:300] if str(exc) else ""
                if compiler == "aoti":
                    raise EngineError(
                        f"AOTInductor could not compile for {device}: {first_line}; install a host compiler "
                        "(gcc) and the CUDA headers, or build with compiler 'auto' (the default: the exported "
                        "program is saved and the runner torch.compiles it)"
                    ) from None
                reason = f"{type(exc).__name__}: {first_line}"
            if not quiet:
                log.warning(
                    f"AOTInductor could not compile ({reason}); saving the exported program, the runner "
                    "will torch.compile it"
                )
        torch.export.save(program, str(built))
        return "torch.compile", reason


def program_path(target: Path) -> Path:
    """Where the exported program is saved beside an AOTInductor package (not ``.pt2``: the
    suffix table would read it as an engine)."""
    return target.with_name(target.name + ".program")


def load_check(
    torch: Any,
    program: Any,
    built: Path,
    target: Path,
    device: str,
    tf32: bool,
    io: list[dict[str, Any]],
    max_batch: int,
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
        tf32=tf32,
        io=io,
        max_batch=max_batch,
        capture=cuda,
    )
    label = f"cuda {torch.cuda.get_device_name(index)}" if cuda else "cpu"
    verdict = probe_load(spec, sha256=sha256_file(built), torch_version=torch.__version__, device_label=label)
    if not verdict.ok:
        log.warning(
            "the built package cannot be loaded by a fresh process here (%s); runners will use the exported "
            "program saved beside it (%s) under torch.compile",
            verdict.reason,
            program_path(target).name,
        )
    return {
        "companions": [(staged_program, program_path(target))],
        "load_check": verdict.record(),
        "load_fallback": program_path(target).name,
    }
