"""``hrm-deploy build-engine``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.choices import Backend, CalibMethod, CpuInt8Recipe, Precision, Target
from hrm_deploy.cli.common import Quiet, user_errors
from hrm_deploy.errors import ConfigError

_SHORT = "Short for --precision "


@app.command("build-engine")
@user_errors
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
    workspace: Annotated[int | None, typer.Option(help="Builder workspace limit in MiB.")] = None,
    opt_level: Annotated[int | None, typer.Option(help="Builder optimization level 0-5 (lower builds faster).")] = None,
    compute_capability: Annotated[
        str | None, typer.Option(help="TensorRT-RTX AOT target, e.g. SM120, SM89, SM86.")
    ] = None,
    timing_cache: Annotated[
        str,
        typer.Option(
            help="TensorRT timing cache base path; the GPU and the TensorRT version are added to the file "
            "name. 'none' builds without one.",
        ),
    ] = "engines/timing.cache",
    threads: Annotated[
        int | None, typer.Option(help="cpu target: ONNX Runtime intra-op threads (default: one per core).")
    ] = None,
    cpu_int8: Annotated[
        CpuInt8Recipe | None,
        typer.Option(
            help="cpu target INT8 recipe. static (default): scales fixed by calibration, answers independent "
            "of batching, kept within --accuracy-budget. dynamic: no calibration, fastest at batch > 1, but "
            "an answer can depend on its batch-mates. blockwise: no calibration, batch-independent, slower "
            "than FP32 on small models.",
        ),
    ] = None,
    no_accuracy_check: Annotated[
        bool,
        typer.Option(
            "--no-accuracy-check",
            help="INT8, FP8, NVFP4 (cpu target: static INT8): skip the comparison with FP32 on held-out puzzles "
            "(e.g. random weights, whose argmax any rounding changes); the manifest says it was not measured.",
        ),
    ] = False,
    no_fuse: Annotated[
        bool,
        typer.Option(
            "--no-fuse",
            help="cpu target: leave attention and RMSNorm as ONNX Runtime's optimizer leaves them "
            "(by default they become its fused CPU kernels, each fused block checked).",
        ),
    ] = False,
    allow_unrolled: Annotated[
        bool,
        typer.Option(
            "--allow-unrolled",
            help="TensorRT: build an unrolled graph whose estimated build is over 3 min / 4 GB "
            "(printed first); without it such a graph's single-step graph is exported and built instead.",
        ),
    ] = False,
    strip_weights: Annotated[
        bool,
        typer.Option(
            "--strip-weights",
            help="TensorRT: a weight-stripped engine (STRIP_PLAN + REFIT_IDENTICAL, a fraction of the size): "
            "the runner refits it from its ONNX graph (sha256-checked) on first run and saves it whole. "
            "Needs a GPU to build (the board, or a GPU machine with the same TensorRT).",
        ),
    ] = False,
    tf32: Annotated[
        bool,
        typer.Option(
            "--tf32",
            help="torch backend, fp32 on CUDA: let float32 matmuls use TF32 (faster, about 1e-3 relative "
            "error); default exact float32. Recorded in the manifest.",
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
) -> None:
    """Build an engine: TensorRT / TensorRT-RTX (strongly typed: the precision lives in the ONNX), the
    cpu target's optimized ONNX Runtime graph, or a PyTorch AOTInductor .pt2."""
    from hrm_deploy.data.benchmarks import prepare_dataset
    from hrm_deploy.engines.build import (
        EngineConfig,
        build_engine as build,
        default_precision,
        refuse_checkpoint_source,
    )
    from hrm_deploy.sources import resolve_artifact

    # before any work: a run folder -> its newest step file, hf:... -> the cached snapshot's file
    onnx = resolve_artifact(onnx)
    refuse_checkpoint_source(onnx, str(target), str(backend) if backend else None)
    calib_data = prepare_dataset(calib_data, splits=("train", "test"), quiet=quiet)
    flags = {"fp16": fp16, "bf16": bf16, "int8": int8, "fp8": fp8, "nvfp4": nvfp4, "fp32": fp32}
    default = default_precision(str(target), str(backend) if backend else None)
    # every backend's options by field name; the building backend's row takes its own and refuses
    # another backend's option that was given (set away from its default) in one line
    options = {
        "workspace_mib": workspace,
        "optimization_level": opt_level,
        "compute_capability": compute_capability,
        "allow_unrolled": allow_unrolled,
        "strip_weights": strip_weights,
        "timing_cache": None if timing_cache.lower() in ("", "none") else timing_cache,
        "threads": threads,
        "fuse": not no_fuse,
        "int8_recipe": cpu_int8.value if cpu_int8 else None,
        "tf32": tf32,
    }
    config = EngineConfig.from_values(
        options,
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
    if (
        onnx is not None and onnx.suffix == ".onnx" and os.path.lexists(onnx)
    ):  # a FIFO, /dev/zero or random bytes: one line, now
        from hrm_deploy.onnx_runtime import load_onnx

        load_onnx(onnx)
    engine_path = None
    if output is not None:  # before any work: never over an input or a file we did not write
        from hrm_deploy.manifest import check_replaceable, output_path

        engine_path = output_path(output, None)
        check_replaceable(engine_path, [onnx, calib_data])
    result = build(onnx, config, engine_path, quiet=quiet)
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
