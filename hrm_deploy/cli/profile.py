"""``hrm-deploy profile``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.choices import Provider
from hrm_deploy.cli.common import user_errors


@app.command()
@user_errors
def profile(
    artifacts: Annotated[
        list[Path],
        typer.Argument(
            help="ONNX graphs, engines, checkpoints (the reference) or trtexec --exportProfile JSONs; the first "
            "two are also shown side by side per ACT step."
        ),
    ],
    data: Annotated[
        Path | None,
        typer.Option("--data", help="Dataset folder for the inputs (default: the reference checkpoint's own)."),
    ] = None,
    batch: Annotated[int, typer.Option(help="Batch size of the profiled calls.")] = 1,
    calls: Annotated[int, typer.Option(help="Profiled calls per artifact (after the warm-up).")] = 3,
    warmup: Annotated[int, typer.Option(help="Warm-up calls per artifact, not profiled.")] = 1,
    threads: Annotated[
        int | None, typer.Option(help="ONNX Runtime intra-op threads (default: the graph's manifest, else ORT's).")
    ] = None,
    reference: Annotated[
        Path | None, typer.Option(help="Also profile this checkpoint on the PyTorch reference.")
    ] = None,
    provider: Annotated[Provider, typer.Option(help="ONNX Runtime provider for .onnx artifacts.")] = Provider.CPU,
    out: Annotated[Path, typer.Option("-o", "--out", help="Folder for profile.json, profile.md, profile.png.")] = Path(
        "bench"
    ),
) -> None:
    """Where the time of one call goes: per model block (embedding, QKV, attention, MLP, ...), host rows."""
    from hrm_deploy.bench.profile import ProfileConfig, profile as run_profile
    from hrm_deploy.data.benchmarks import prepare_dataset
    from hrm_deploy.manifest import output_path
    from hrm_deploy.sources import resolve_optional_checkpoint

    out = output_path(out, None, folder=True)  # -o NEWDIR/ or NEWDIR: the report folder; a file is one line

    reference = resolve_optional_checkpoint(reference)
    data = prepare_dataset(data)
    config = ProfileConfig(
        data=str(data) if data else None,
        batch=batch,
        calls=calls,
        warmup=warmup,
        provider=provider.value,
        threads=threads,
        out_dir=str(out),
    )
    result = run_profile([str(a) for a in artifacts], config, reference=reference)
    typer.echo((out / "profile.md").read_text())
    typer.echo(
        f"wrote {out / 'profile.json'} and {out / 'profile.md'}"
        + (f" and {result['plot']}" if result.get("plot") else "")
    )
