"""``hrm-deploy build-engine``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.choices import Backend, CalibMethod, Precision, Target, make_choice
from hrm_deploy.cli.common import Quiet, user_errors
from hrm_deploy.errors import ConfigError

_SHORT = "Short for --precision "


def backend_flags(command: Callable[..., None]) -> Callable[..., None]:
    """``command`` with a keyword parameter per build option (:func:`hrm_deploy.engines.options.command_line`):
    the flag, its help and choices come from the options class's field, grouped under the backend that
    takes it, so a backend's new option is a new flag with no edit here."""
    from hrm_deploy.engines.options import command_line

    params = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.kind is not p.VAR_KEYWORD]
    for flag in command_line():
        kind: Any = bool if flag.switch else flag.kind
        if flag.choices:  # an Enum, so --help lists them and Typer refuses anything else in one line
            kind = make_choice(flag.name.title().replace("_", ""), flag.choices, flag.help)
            kind = kind | None if flag.default is None else kind
        option = typer.Option(flag.flag, help=flag.help, rich_help_panel=f"Options of {flag.owner.taker}")
        default = False if flag.switch else flag.default
        params.append(
            inspect.Parameter(
                flag.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind, option]
            )
        )
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return command


@app.command("build-engine")
@user_errors
@backend_flags
def build_engine(
    onnx: Annotated[
        Path | None,
        typer.Argument(
            help="ONNX graph (default: the newest FP32 export in export/); with --backend torch also a checkpoint, "
            "run folder or hf:ORG/NAME."
        ),
    ] = None,
    precision: Annotated[
        Precision | None,
        typer.Option(
            help="fp16 and bf16 keep float32 islands; int8, fp8 (E4M3, compute capability >= 8.9) and nvfp4 "
            "(FP4 E2M1 in blocks of 16, Blackwell: >= 10.0) are Q/DQ (calibrate an FP32 graph first). "
            "Default fp16, or fp32 with --backend torch or --target cpu.",
        ),
    ] = None,
    fp16: Annotated[bool, typer.Option("--fp16", help=_SHORT + "fp16.")] = False,
    bf16: Annotated[bool, typer.Option("--bf16", help=_SHORT + "bf16.")] = False,
    int8: Annotated[bool, typer.Option("--int8", help=_SHORT + "int8.")] = False,
    fp8: Annotated[bool, typer.Option("--fp8", help=_SHORT + "fp8.")] = False,
    nvfp4: Annotated[bool, typer.Option("--nvfp4", help=_SHORT + "nvfp4.")] = False,
    fp32: Annotated[bool, typer.Option("--fp32", help=_SHORT + "fp32.")] = False,
    calib_data: Annotated[
        Path | None,
        typer.Option(
            help="Dataset folder (upstream format), .npz of inputs, or a benchmark's CSVs / hf:ORG/NAME (built "
            "once into the user cache) (default: the checkpoint's own dataset, from its provenance).",
        ),
    ] = None,
    calib_method: Annotated[
        CalibMethod, typer.Option(help="INT8 calibration (minmax: measured as accurate, cheapest).")
    ] = CalibMethod.MINMAX,
    calib_samples: Annotated[
        int | None,
        typer.Option(
            help="Calibration examples K (chosen deterministically). Default 128 (measured enough); a model so "
            "costly that even 64 held-out puzzles are over a minute of FP32 work calibrates on 64, which are then "
            "also the accuracy check's holdout (FP32 runs once)."
        ),
    ] = None,
    accuracy_budget: Annotated[
        float | None,
        typer.Option(
            help="INT8, FP8, NVFP4: exact-accuracy points the graph may lose against FP32 on held-out puzzles "
            "(default 1, and >= 98 % argmax agreement); harmful layers stay float until it holds."
        ),
    ] = None,
    target: Annotated[
        Target,
        typer.Option(
            help="desktop: RTX 50 (sm_120); cpu: ONNX Runtime CPU (ORT-optimized graph, INT8 = integer GEMMs)."
        ),
    ] = "desktop",
    backend: Annotated[
        Backend | None,
        typer.Option(
            help="Default: the target's first TensorRT flavour; torch: an AOTInductor .pt2 for this machine's "
            "GPU or CPU (fp32 default, or bf16).",
        ),
    ] = None,
    min_batch: Annotated[int | None, typer.Option(help="Optimization profile: smallest batch.")] = None,
    opt_batch: Annotated[int | None, typer.Option(help="Optimization profile: batch tuned for.")] = None,
    max_batch: Annotated[int | None, typer.Option(help="Optimization profile: largest batch.")] = None,
    no_accuracy_check: Annotated[
        bool,
        typer.Option(
            "--no-accuracy-check",
            help="INT8, FP8, NVFP4 (cpu target: static INT8): skip the comparison with FP32 on held-out puzzles "
            "(e.g. random weights, whose argmax any rounding changes); the manifest says it was not measured.",
        ),
    ] = False,
    output: Annotated[
        str | None,  # a string, not a Path: "-o DIR/" keeps its slash and is told to name a file
        typer.Option(
            "-o",
            "--out",
            "--output",
            help="Engine path (default: in engines/, named after the ONNX, precision, target and backend).",
        ),
    ] = None,
    quiet: Quiet = False,
    **backend_options: Any,  # every backend's build options, one flag per field (added below)
) -> None:
    """Build an engine: TensorRT / TensorRT-RTX (strongly typed: the precision lives in the ONNX), the
    cpu target's optimized ONNX Runtime graph, or a PyTorch AOTInductor .pt2."""
    from hrm_deploy.engines.build import EngineConfig, build_engine_from, default_precision
    from hrm_deploy.engines.options import from_command_line

    flags = {"fp16": fp16, "bf16": bf16, "int8": int8, "fp8": fp8, "nvfp4": nvfp4, "fp32": fp32}
    default = default_precision(str(target), str(backend) if backend else None)
    # every backend's options by field name; the building backend's row takes its own and refuses
    # another backend's option that was given (set away from its default) in one line
    values = from_command_line({name: str(v) if isinstance(v, Enum) else v for name, v in backend_options.items()})
    config = EngineConfig.from_values(
        values,
        precision=_precision(str(precision) if precision else None, flags, default),
        target=str(target),
        backend=str(backend) if backend else None,
        min_batch=min_batch,
        opt_batch=opt_batch,
        max_batch=max_batch,
        calib_data=str(calib_data) if calib_data else None,
        calib_method=calib_method.value,
        calib_samples=calib_samples,
        accuracy_budget=accuracy_budget,
        accuracy_check=not no_accuracy_check,
    )
    result = build_engine_from(onnx, config, output, quiet=quiet)
    seconds = result.build.get("build_seconds", 0.0)
    typer.echo(
        f"wrote {result.path} ({result.build.get('engine_bytes', 0) / 2**20:.1f} MiB, built in {seconds:.1f} s) "
        f"and {result.manifest.name}"
    )


def _precision(precision: str | None, flags: dict[str, bool], default: str) -> str:
    """The one precision asked for by --precision and/or its short flags (saying the same twice is fine)."""
    asked = {f"--precision {precision}": precision} if precision else {}
    asked.update({f"--{p}": p for p, on in flags.items() if on})
    if len(set(asked.values())) > 1:
        raise ConfigError(f"choose one precision, not {' and '.join(asked)}")
    return next(iter(asked.values()), default)
