"""``hrm-deploy adapt``: teach an ARC checkpoint new tasks from their demonstrations (test-time training)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hrm_deploy.arc.choices import AdaptTrain
from hrm_deploy.cli import app
from hrm_deploy.cli.common import Quiet, user_errors


@app.command()
@user_errors
def adapt(
    checkpoint: Annotated[str, typer.Argument(help="The trained ARC checkpoint (file, run folder or hf:ORG/NAME).")],
    tasks: Annotated[list[Path], typer.Option("--tasks", help="ARC task JSON files or a folder of them (repeatable).")],
    out: Annotated[
        Path, typer.Option("-o", "--out", help="New folder: adapted last.pt, data/ (the new tasks), adapt.json.")
    ],
    steps: Annotated[int, typer.Option(help="Budget in optimizer steps (one ACT segment on one batch).")] = 200,
    minutes: Annotated[
        float | None, typer.Option(help="Budget in minutes of training (stops at whichever comes first).")
    ] = None,
    train: Annotated[
        AdaptTrain, typer.Option(help="embeddings: only the new rows change; all: fine-tune every weight too.")
    ] = AdaptTrain.EMBEDDINGS,
    num_aug: Annotated[int, typer.Option(help="Augmented copies per task, as `data arc` (upstream: 1000).")] = 1000,
    seed: Annotated[int, typer.Option(help="Seed of the augmentations and the training.")] = 0,
    batch_size: Annotated[int | None, typer.Option(help="Copies per batch (default: up to 32).")] = None,
    lr: Annotated[float, typer.Option(help="Weights' learning rate (with --train all).")] = 1e-4,
    puzzle_emb_lr: Annotated[float, typer.Option(help="The new rows' sign-SGD step.")] = 1e-2,
    base_data: Annotated[
        Path | None, typer.Option(help="The base's dataset folder, to check new task names against its identifiers.")
    ] = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Adapt a task the base already has rows for (new rows; the old stay).")
    ] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue the adapt run in --out.")] = False,
    device: Annotated[str, typer.Option(help="auto (CUDA when available), cpu, cuda or cuda:N.")] = "auto",
    threads: Annotated[int, typer.Option(help="CPU threads for torch (0: torch's default).")] = 0,
    checkpoint_minutes: Annotated[float, typer.Option(help="Refresh OUT/last.pt at least this often.")] = 5.0,
    quiet: Quiet = False,
) -> None:
    """Append puzzle-embedding rows for new ARC tasks and train them on the tasks' demonstration pairs only.

    The base checkpoint is untouched. With --train embeddings an ONNX graph of the base exported with
    --puzzle-emb external answers the new tasks: `arc-eval GRAPH --data OUT/data --puzzle-table OUT`.
    Multi-GPU: `torchrun --nproc-per-node N -m hrm_deploy adapt ...` (DDP; --batch-size a multiple of N)."""
    from hrm_deploy.arc.adapt import AdaptConfig, adapt as run_adapt
    from hrm_deploy.manifest import output_path
    from hrm_deploy.system import check_threads

    check_threads(threads)
    out = output_path(out, None, folder=True)  # -o NEWDIR/ or NEWDIR: the adapt folder; a file there is one line
    config = AdaptConfig(
        checkpoint=checkpoint,
        tasks=tuple(str(t) for t in tasks),
        out=str(out),
        steps=steps,
        minutes=minutes,
        train=train.value,
        num_aug=num_aug,
        seed=seed,
        batch_size=batch_size,
        lr=lr,
        puzzle_emb_lr=puzzle_emb_lr,
        base_data=str(base_data) if base_data else None,
        replace=replace,
        device=device,
        threads=threads,
        checkpoint_minutes=checkpoint_minutes,
    )
    result = run_adapt(config, resume=resume, progress=not quiet)
    if result.interrupted:
        if result.main:  # under torchrun rank 0 reports; every rank exits 130
            typer.echo(
                f"interrupted at step {result.steps_done}: wrote {result.checkpoint}; continue with --resume", err=True
            )
        raise typer.Exit(130)
    if not result.main:
        return
    typer.echo(
        f"wrote {result.checkpoint} ({result.steps_done} steps), {result.data} and {result.record}; score it with "
        f"`hrm-deploy arc-eval {result.checkpoint} --data {result.data}`"
    )
