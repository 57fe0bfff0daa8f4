"""``hrm-deploy train``."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.common import user_errors


@app.command()
@user_errors
def train(
    data: Path = typer.Option(..., "--data", help="Dataset folder in upstream's format (train/ and test/)."),
    preset: str = typer.Option(
        "sudoku-tiny",
        help="sudoku-tiny (CPU, 1 ACT step), sudoku-small (CPU, 8 ACT steps), "
        "sudoku or maze (upstream's GPU settings).",
    ),
    out: Path = typer.Option(Path("runs/hrm"), "-o", "--out", help="Run folder: last.pt, step_N.pt, metrics.jsonl."),
    steps: Optional[int] = typer.Option(
        None,
        help="Optimizer steps. One step = one ACT segment on one global batch; an example stays "
        "up to halt_max_steps steps, so steps x batch / halt_max_steps ~ examples seen.",
    ),
    batch_size: Optional[int] = typer.Option(None, help="Global batch size."),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate."),
    optimizer: Optional[str] = typer.Option(None, help="adam_atan2 (upstream's, pure PyTorch) or adamw."),
    seed: Optional[int] = typer.Option(None, help="Random seed."),
    resume: Optional[Path] = typer.Option(None, help="Continue from a checkpoint written by this trainer."),
    checkpoint_every: Optional[int] = typer.Option(None, help="Also write step_N.pt every N steps (0: never)."),
    checkpoint_minutes: float = typer.Option(
        5.0,
        help="Refresh OUT/last.pt at least this often (0: only at the end). "
        "Ctrl-C / SIGTERM always checkpoint before stopping.",
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Start over in an --out folder that already holds a run."
    ),
    device: str = typer.Option(
        "auto",
        help="auto (CUDA when available), cpu, cuda or cuda:N. Under torchrun each process takes GPU LOCAL_RANK.",
    ),
    compile: bool = typer.Option(False, "--compile", help="torch.compile the model (GPU; compiles for minutes first)."),
    threads: int = typer.Option(0, help="CPU threads for torch (0: torch's default)."),
    export_upstream: bool = typer.Option(
        False, "--export-upstream", help="Also write upstream's step_N + all_config.yaml under OUT/upstream."
    ),
    log_to: Optional[List[str]] = typer.Option(
        None, "--log-to", help="Also log metrics to tensorboard or wandb (repeatable; needs that package)."
    ),
) -> None:
    """Train HRM with upstream's semantics (persistent ACT carry, Q-learning halting).

    sudoku-tiny reaches >= 90% exact accuracy in about 3 minutes on 2 CPU cores on data from
    `hrm-deploy data sudoku --train 5000 --test 300 --min-blanks 3 --max-blanks 6`.
    Multi-GPU: `torchrun --nproc-per-node N -m hrm_deploy train ...` (DDP)."""
    from hrm_deploy.train.loop import train as run_training
    from hrm_deploy.train.presets import train_configs

    model_config, config = train_configs(
        preset,
        data,
        out,
        device=device,
        compile=compile,
        threads=threads,
        export_upstream=export_upstream,
        log_to=tuple(log_to or ()),
        checkpoint_minutes=checkpoint_minutes,
        overwrite=overwrite,
        overrides=dict(
            steps=steps,
            global_batch_size=batch_size,
            lr=lr,
            optimizer=optimizer,
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
