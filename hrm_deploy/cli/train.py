"""``hrm-deploy train``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.choices import Optimizer, Preset, Sink
from hrm_deploy.cli.common import user_errors


@app.command()
@user_errors
def train(
    data: Annotated[Path, typer.Option("--data", help="Dataset folder in upstream's format (train/ and test/).")],
    preset: Annotated[
        Preset,
        typer.Option(
            help="sudoku-tiny: CPU, 1 ACT step; sudoku-small: CPU, 8 ACT steps; sudoku, maze: upstream's GPU settings."
        ),
    ] = Preset.SUDOKU_TINY,
    out: Annotated[Path, typer.Option("-o", "--out", help="Run folder: last.pt, step_N.pt, metrics.jsonl.")] = Path(
        "runs/hrm"
    ),
    steps: Annotated[
        int | None,
        typer.Option(
            help="Optimizer steps. One step = one ACT segment on one global batch; an example stays "
            "up to halt_max_steps steps, so steps x batch / halt_max_steps ~ examples seen.",
        ),
    ] = None,
    batch_size: Annotated[int | None, typer.Option(help="Global batch size.")] = None,
    lr: Annotated[float | None, typer.Option(help="Peak learning rate.")] = None,
    optimizer: Annotated[
        Optimizer | None, typer.Option(help="adam_atan2: upstream's, in pure PyTorch (the presets' choice).")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed.")] = None,
    resume: Annotated[Path | None, typer.Option(help="Continue from a checkpoint written by this trainer.")] = None,
    checkpoint_every: Annotated[int | None, typer.Option(help="Also write step_N.pt every N steps (0: never).")] = None,
    checkpoint_minutes: Annotated[
        float,
        typer.Option(
            help="Refresh OUT/last.pt at least this often (0: only at the end). "
            "Ctrl-C / SIGTERM always checkpoint before stopping.",
        ),
    ] = 5.0,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Start over in an --out folder that already holds a run.")
    ] = False,
    device: Annotated[
        str,
        typer.Option(
            help="auto (CUDA when available), cpu, cuda or cuda:N. Under torchrun each process takes GPU LOCAL_RANK.",
        ),
    ] = "auto",
    compile: Annotated[
        bool, typer.Option("--compile", help="torch.compile the model (GPU; compiles for minutes first).")
    ] = False,
    threads: Annotated[int, typer.Option(help="CPU threads for torch (0: torch's default).")] = 0,
    export_upstream: Annotated[
        bool,
        typer.Option("--export-upstream", help="Also write upstream's step_N + all_config.yaml under OUT/upstream."),
    ] = False,
    log_to: Annotated[
        list[Sink] | None,
        typer.Option("--log-to", help="Also log metrics there (repeatable; needs that package)."),
    ] = None,
) -> None:
    """Train HRM with upstream's semantics (persistent ACT carry, Q-learning halting).

    sudoku-tiny reaches >= 90% exact accuracy in about 3 minutes on 2 CPU cores on data from
    `hrm-deploy data sudoku --train 5000 --test 300 --min-blanks 3 --max-blanks 6`.
    Multi-GPU: `torchrun --nproc-per-node N -m hrm_deploy train ...` (DDP)."""
    from hrm_deploy.manifest import output_path
    from hrm_deploy.system import check_threads
    from hrm_deploy.train.loop import train as run_training
    from hrm_deploy.train.presets import train_configs

    check_threads(threads)
    out = output_path(out, None, folder=True)  # -o NEWDIR/ or NEWDIR: the run folder; a file there is one line
    model_config, config = train_configs(
        preset.value,
        data,
        out,
        device=device,
        compile=compile,
        threads=threads,
        export_upstream=export_upstream,
        log_to=tuple(sink.value for sink in log_to or ()),
        checkpoint_minutes=checkpoint_minutes,
        overwrite=overwrite,
        overrides=dict(
            steps=steps,
            global_batch_size=batch_size,
            lr=lr,
            optimizer=optimizer.value if optimizer else None,
            seed=seed,
            checkpoint_every=checkpoint_every,
        ),
    )
    result = run_training(model_config, config, resume=str(resume) if resume else None)
    if result.interrupted:
        typer.echo(
            f"interrupted at step {result.metrics.get('step', 0)}: wrote {result.checkpoint}; continue with "
            f"--resume {result.checkpoint}",
            err=True,
        )
        raise typer.Exit(130)
    final = result.metrics.get("eval", {})
    typer.echo(f"wrote {result.checkpoint}; test exact accuracy {final.get('exact_accuracy', float('nan')):.3f}")
