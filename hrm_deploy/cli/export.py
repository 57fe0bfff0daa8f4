"""``hrm-deploy export``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.choices import ExportMode, PuzzleEmb
from hrm_deploy.cli.common import Quiet, bundled_checkpoint, user_errors
from hrm_deploy.errors import ConfigError


@app.command()
@user_errors
def export(
    checkpoint: Annotated[
        Path | None,
        typer.Argument(
            help="step_N file, run folder (newest step_N), our .pt, or hf:ORG/NAME, hf:ORG/NAME@REVISION/PATH (a Hub "
            "repository, e.g. hf:sapientinc/HRM-checkpoint-sudoku-extreme); default: the bundled sudoku-small model."
        ),
    ] = None,
    output: Annotated[
        str | None,  # a string, not a Path: "-o NEWDIR/" keeps its slash (a folder to make)
        typer.Option("-o", "--out", "--output", help="Output .onnx, or a folder (default export/<name>.onnx)."),
    ] = None,
    mode: Annotated[
        ExportMode | None,
        typer.Option(
            metavar="<mode>",
            help="unrolled: all ACT steps in one graph; step: one segment, carry in/out; loop: the ACT loop "
            "inside the graph, one call per answer, stopping when every row has halted by --halt "
            "(default: unrolled for HRM, step for TRM).",
        ),
    ] = None,
    halt: Annotated[
        str,
        typer.Option(
            metavar="<rule>",
            help="--mode loop: the halting rule the graph tests after each step: off (every step), q (the "
            "model's training rule) or threshold:X (sigmoid(q_halt) > X).",
        ),
    ] = "off",
    steps: Annotated[int | None, typer.Option(help="ACT steps to unroll (default: halt_max_steps).")] = None,
    max_batch: Annotated[int, typer.Option(help="Largest batch the graph is meant for (engine profiles use it).")] = 64,
    opset: Annotated[int, typer.Option(help="ONNX opset (>= 17).")] = 18,
    step_predictions: Annotated[
        bool, typer.Option("--step-predictions", help="Also output per-step argmax predictions [B, steps, S].")
    ] = False,
    parity: Annotated[bool, typer.Option(help="Check parity against PyTorch on ONNX Runtime CPU.")] = True,
    puzzle_emb: Annotated[
        PuzzleEmb,
        typer.Option(
            metavar="<placement>",
            help="Puzzle-embedding table: embedded (in the graph) or external (a .npy beside it; the graph takes "
            "the gathered rows, runners read them from the memory-mapped file). For ARC's large tables.",
        ),
    ] = PuzzleEmb.EMBEDDED,
    seq_len: Annotated[int | None, typer.Option(help="Override/provide seq_len (upstream: from dataset.json).")] = None,
    vocab_size: Annotated[int | None, typer.Option(help="Override/provide vocab_size.")] = None,
    num_puzzle_ids: Annotated[
        int | None, typer.Option(help="Override/provide the number of puzzle identifiers.")
    ] = None,
    data_path: Annotated[
        Path | None,
        typer.Option(
            help="Dataset folder holding train/ or test/dataset.json (upstream checkpoints: seq_len, vocab), "
            "or a benchmark's CSVs / hf:ORG/NAME (its test split is built once into the user cache)."
        ),
    ] = None,
    num_heads: Annotated[
        int | None, typer.Option(help="Override arch.num_heads (if all_config.yaml is absent).")
    ] = None,
    h_cycles: Annotated[int | None, typer.Option(help="Override arch.H_cycles.")] = None,
    l_cycles: Annotated[int | None, typer.Option(help="Override arch.L_cycles.")] = None,
    halt_max_steps: Annotated[int | None, typer.Option(help="Override arch.halt_max_steps.")] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Export a bundled model instead of CHECKPOINT: sudoku-small, sudoku-tiny or trm-sudoku-small (TRM).",
        ),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Export a checkpoint to a checked, parity-tested FP32 ONNX graph with dynamic batch."""
    from hrm_deploy.data.benchmarks import prepare_dataset
    from hrm_deploy.data.format import DatasetMetadata
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.puzzle_table import Placement
    from hrm_deploy.sources import resolve_checkpoint

    if model is not None:
        if checkpoint is not None:
            raise ConfigError("give a CHECKPOINT or --model NAME, not both")
        checkpoint = Path(bundled_checkpoint(model))
    elif checkpoint is None:
        checkpoint = Path(bundled_checkpoint())
        typer.echo(f"no checkpoint given: exporting the bundled sudoku-small model ({checkpoint})", err=True)
    else:  # before any work: a run folder's newest step file, a Hub snapshot fetched into the cache
        checkpoint = resolve_checkpoint(checkpoint)
    prepared = prepare_dataset(data_path, quiet=quiet)
    if prepared is not None and data_path is not None and prepared != data_path and seq_len is None:
        # a Hub benchmark (built into the cache): its seq_len is recorded as a given field, so the
        # reference loads the same way later (verify, bench) without the cached folder
        seq_len = DatasetMetadata.from_json(prepared / "test" / "dataset.json").seq_len
    data_path = prepared
    result = export_onnx(
        checkpoint,
        output,
        ExportConfig(
            mode=mode.value if mode else None,
            steps=steps,
            max_batch=max_batch,
            opset=opset,
            step_predictions=step_predictions,
            parity=parity,
            puzzle_emb=Placement(puzzle_emb.value),
            halt=halt,
        ),
        quiet=quiet,
        seq_len=seq_len,
        vocab_size=vocab_size,
        num_puzzle_identifiers=num_puzzle_ids,
        data_path=str(data_path) if data_path else None,
        num_heads=num_heads,
        H_cycles=h_cycles,
        L_cycles=l_cycles,
        halt_max_steps=halt_max_steps,
    )
    if result.parity:
        worst = max((v["logits"]["max_abs"] for v in result.parity["batches"].values()), default=0.0)
        agree = min((v["logits"]["argmax_agreement"] for v in result.parity["batches"].values()), default=1.0)
        typer.echo(
            f"parity vs PyTorch: logits max abs error {worst:.3g}, argmax agreement {agree:.2%} "
            f"(batches {', '.join(result.parity['batches'])})"
        )
    typer.echo(f"wrote {result.path} ({result.nodes} nodes) and {result.manifest.name}")
