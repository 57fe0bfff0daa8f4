"""``hrm-deploy bench``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.choices import BenchTarget, Provider
from hrm_deploy.cli.common import user_errors


@app.command()
@user_errors
def bench(
    artifacts: Annotated[
        list[Path] | None, typer.Argument(help="ONNX graphs / engines (default: every engine in engines/).")
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="Dataset folder (test split), or a benchmark's CSVs / hf:ORG/NAME, for inputs and exact accuracy "
            "(default: the reference checkpoint's own dataset).",
        ),
    ] = None,
    target: Annotated[BenchTarget, typer.Option(help="jetson adds tegrastats power and JetPack facts.")] = (
        BenchTarget.DESKTOP
    ),
    host: Annotated[
        str | None, typer.Option(help="USER@HOST: run the bench there over SSH and fetch the report.")
    ] = None,
    batch: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1,8",
    iters: Annotated[
        int | None, typer.Option(help="Force this many timed calls per artifact and batch (default: --duration).")
    ] = None,
    duration: Annotated[
        float,
        typer.Option(
            help="Seconds of timed calls per artifact and batch, like trtexec --duration (at least 10 calls, "
            "for the percentiles); --iters overrides it.",
        ),
    ] = 10.0,
    warmup: Annotated[int, typer.Option(help="Warm-up iterations per batch.")] = 3,
    reference: Annotated[
        Path | None, typer.Option(help="Reference checkpoint, run folder or hf:ORG/NAME (default: from the manifests).")
    ] = None,
    no_reference: Annotated[bool, typer.Option("--no-reference", help="Skip the PyTorch reference row.")] = False,
    provider: Annotated[Provider, typer.Option(help="ONNX Runtime provider for .onnx artifacts.")] = Provider.CPU,
    out: Annotated[Path, typer.Option("-o", "--out", help="Folder for report.json, report.md, latency.png.")] = Path(
        "bench"
    ),
    remote_python: Annotated[
        str, typer.Option(help="With --host: the Python on the remote that has hrm-deploy.")
    ] = "python3",
    ssh_option: Annotated[
        list[str] | None,
        typer.Option(
            "--ssh-option",
            help="With --host: an ssh_config option KEY=VALUE passed as ssh -o (e.g. Port=2222; repeatable). "
            "It is your own ssh configuration and runs as you.",
        ),
    ] = None,
    halt: Annotated[
        list[str] | None,
        typer.Option(
            "--halt", help="Also measure early halting under this rule (repeatable): q, threshold:X, budget:P."
        ),
    ] = None,
    min_steps: Annotated[int, typer.Option(help="Halting: never stop before this ACT step.")] = 1,
    max_steps: Annotated[int | None, typer.Option(help="Halting: always stop at this ACT step.")] = None,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="Also time every layer, per model block, at the first batch size (profile.json, profile.md, "
            "profile.png beside the report; see hrm-deploy profile).",
        ),
    ] = False,
) -> None:
    """Latency, throughput, memory and accuracy of artifacts next to the PyTorch reference."""
    from hrm_deploy.bench.run import BenchConfig, bench as run_bench
    from hrm_deploy.data.benchmarks import prepare_dataset
    from hrm_deploy.errors import ConfigError
    from hrm_deploy.manifest import output_path
    from hrm_deploy.sources import resolve_optional_checkpoint

    out = output_path(out, None, folder=True)  # -o NEWDIR/ or NEWDIR: the report folder; a file is one line

    try:
        batches = tuple(int(b) for b in batch.split(",") if b.strip())
    except ValueError:
        raise ConfigError(f"--batch {batch!r}: give comma-separated integers such as 1,8,64") from None
    if not host:  # before any work (with --host the paths are the remote machine's)
        reference = resolve_optional_checkpoint(reference)
        data = prepare_dataset(data)
    config = BenchConfig(
        data=str(data) if data else None,
        batches=batches,
        halt=tuple(halt or ()),
        min_steps=min_steps,
        max_steps=max_steps,
        profile=profile,
        iters=iters,
        warmup=warmup,
        duration_s=duration,
        reference=str(reference) if reference else None,
        include_reference=not no_reference,
        target=target.value,
        provider=provider.value,
        out_dir=str(out),
    )
    if host:
        from hrm_deploy.bench.remote import bench_remote, ssh_options

        options = ssh_options(ssh_option or [])
        report = bench_remote(
            host, [str(a) for a in artifacts or []], config, remote_python=remote_python, ssh_options=options
        )
    else:
        report = run_bench([str(a) for a in artifacts or []], config)
    from hrm_deploy.bench.run import table

    typer.echo(table(report))
    typer.echo(
        f"wrote {out / 'report.json'} and {out / 'report.md'}"
        + (f" and {report['plot']}" if report.get("plot") else "")
        + (f"; per-layer profile in {report['profile']}" if report.get("profile") else "")
    )
