"""``hrm-deploy build-engine``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.common import user_errors


@app.command("build-engine")
@user_errors
def build_engine(
    onnx: Optional[Path] = typer.Argument(
        None, help="ONNX graph (default: the newest FP32 export in export/); with --backend torch also a checkpoint."
    ),
    fp16: bool = typer.Option(False, "--fp16", help="FP16 with float32 islands (default precision)."),
    bf16: bool = typer.Option(False, "--bf16", help="BF16 with float32 islands."),
    int8: bool = typer.Option(
        False, "--int8", help="INT8 Q/DQ (calibrates an FP32 graph first; data default: the checkpoint's own dataset)."
    ),
    fp32: bool = typer.Option(False, "--fp32", help="Plain FP32 engine."),
    calib_data: Optional[Path] = typer.Option(
        None,
        help="Dataset folder (upstream format) or .npz of inputs "
        "(default: the checkpoint's own dataset, from its provenance).",
    ),
    calib_method: str = typer.Option(
        "minmax", help="minmax (default: measured as accurate, cheapest), entropy or percentile."
    ),
    calib_samples: int = typer.Option(
        128, help="Calibration examples K (chosen deterministically; 128 measured enough)."
    ),
    accuracy_budget: Optional[float] = typer.Option(
        None, help="INT8: exact-accuracy points INT8 may lose on the holdout; harmful layers stay float until it holds."
    ),
    target: str = typer.Option(
        "desktop",
        help="desktop (RTX 50, sm_120), jetson-orin-8gb, datacenter or cpu "
        "(ONNX Runtime CPU: ORT-optimized graph, INT8 = dynamic integer GEMMs).",
    ),
    backend: Optional[str] = typer.Option(
        None,
        help="tensorrt or tensorrt-rtx (default: the target's first), or torch "
        "(an AOTInductor .pt2 for this machine's GPU or CPU; --fp32 default, or --bf16).",
    ),
    min_batch: Optional[int] = typer.Option(None, help="Optimization profile: smallest batch."),
    opt_batch: Optional[int] = typer.Option(None, help="Optimization profile: batch tuned for."),
    max_batch: Optional[int] = typer.Option(None, help="Optimization profile: largest batch."),
    workspace: Optional[int] = typer.Option(None, help="Builder workspace limit in MiB."),
    opt_level: Optional[int] = typer.Option(None, help="Builder optimization level 0-5 (lower builds faster)."),
    compute_capability: Optional[str] = typer.Option(None, help="TensorRT-RTX AOT target, e.g. SM120, SM89, SM86."),
    timing_cache: str = typer.Option(
        "engines/timing.cache",
        help="TensorRT timing cache base path; the file name gets the GPU and TensorRT "
        "version (engines/timing.<gpu>-sm<cc>.tensorrt-<version>.cache). 'none' builds without one.",
    ),
    threads: Optional[int] = typer.Option(
        None, help="cpu target: ONNX Runtime intra-op threads (default: one per core)."
    ),
    allow_unrolled: bool = typer.Option(
        False,
        "--allow-unrolled",
        help="TensorRT: build an unrolled graph whose estimated build is over 3 min / 4 GB "
        "(printed first; otherwise refused: export --mode step builds in about a minute).",
    ),
    output: Optional[Path] = typer.Option(
        None,
        "-o",
        "--out",
        "--output",
        help="Engine path (default engines/<name>.<target>.<backend>.engine; "
        "cpu: engines/<name>.<precision>.cpu.ort.onnx).",
    ),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress display."),
) -> None:
    """Build a strongly typed TensorRT / TensorRT-RTX engine; the precision lives in the ONNX."""
    from hrm_deploy.engines.build import EngineConfig, build_engine as build
    from hrm_deploy.errors import ConfigError

    chosen = [name for name, flag in (("fp16", fp16), ("bf16", bf16), ("int8", int8), ("fp32", fp32)) if flag]
    if len(chosen) > 1:
        raise ConfigError(f"choose one precision, not {' and '.join('--' + c for c in chosen)}")
    default = "fp32" if backend == "torch" or target == "cpu" else "fp16"
    config = EngineConfig(
        precision=chosen[0] if chosen else default,
        target=target,
        backend=backend,
        min_batch=min_batch,
        opt_batch=opt_batch,
        max_batch=max_batch,
        workspace_mib=workspace,
        optimization_level=opt_level,
        compute_capability=compute_capability,
        calib_data=str(calib_data) if calib_data else None,
        calib_method=calib_method,
        calib_samples=calib_samples,
        accuracy_budget=accuracy_budget,
        timing_cache=None if timing_cache.lower() in ("", "none") else timing_cache,
        threads=threads,
        allow_unrolled=allow_unrolled,
    )
    result = build(onnx, config, output, quiet=quiet)
    seconds = result.build.get("build_seconds", 0.0)
    typer.echo(
        f"wrote {result.path} ({result.build.get('engine_bytes', 0) / 2**20:.1f} MiB, built in {seconds:.1f} s) "
        f"and {result.manifest.name}"
    )
