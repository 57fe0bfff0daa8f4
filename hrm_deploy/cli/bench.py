"""``hrm-deploy bench``."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.common import user_errors


@app.command()
@user_errors
def bench(
    artifacts: Optional[List[Path]] = typer.Argument(
        None, help="ONNX graphs / engines (default: every engine in engines/)."
    ),
    data: Optional[Path] = typer.Option(
        None,
        "--data",
        help="Dataset folder (test split) for inputs and exact accuracy "
        "(default: the reference checkpoint's own dataset).",
    ),
    target: str = typer.Option("desktop", help="desktop or jetson (jetson adds tegrastats power, JetPack facts)."),
    host: Optional[str] = typer.Option(None, help="USER@HOST: run the bench there over SSH and fetch the report."),
    batch: str = typer.Option("1,8", help="Comma-separated batch sizes."),
    iters: int = typer.Option(20, help="Timed iterations per batch."),
    warmup: int = typer.Option(3, help="Warm-up iterations per batch."),
    reference: Optional[Path] = typer.Option(None, help="Reference checkpoint (default: from the manifests)."),
    no_reference: bool = typer.Option(False, "--no-reference", help="Skip the PyTorch reference row."),
    provider: str = typer.Option("cpu", help="ONNX Runtime provider for .onnx artifacts: cpu, cuda, tensorrt."),
    out: Path = typer.Option(Path("bench"), "-o", "--out", help="Folder for report.json, report.md, latency.png."),
    remote_python: str = typer.Option("python3", help="With --host: the Python on the remote that has hrm-deploy."),
    ssh_option: Optional[List[str]] = typer.Option(
        None,
        "--ssh-option",
        help="With --host: an ssh_config option KEY=VALUE passed as ssh -o (e.g. Port=2222; repeatable). "
        "It is your own ssh configuration and runs as you.",
    ),
    halt: Optional[List[str]] = typer.Option(
        None, "--halt", help="Also measure early halting under this rule (repeatable): q, threshold:X, budget:P."
    ),
    min_steps: int = typer.Option(1, help="Halting: never stop before this ACT step."),
    max_steps: Optional[int] = typer.Option(None, help="Halting: always stop at this ACT step."),
) -> None:
    """Latency, throughput, memory and accuracy of artifacts next to the PyTorch reference."""
    from hrm_deploy.bench.run import BenchConfig, bench as run_bench
    from hrm_deploy.errors import ConfigError

    try:
        batches = tuple(int(b) for b in batch.split(",") if b.strip())
    except ValueError:
        raise ConfigError(f"--batch {batch!r}: give comma-separated integers such as 1,8,64") from None
    config = BenchConfig(
        data=str(data) if data else None,
        batches=batches,
        halt=tuple(halt or ()),
        min_steps=min_steps,
        max_steps=max_steps,
        iters=iters,
        warmup=warmup,
        reference=str(reference) if reference else None,
        include_reference=not no_reference,
        target=target,
        provider=provider,
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
    )
