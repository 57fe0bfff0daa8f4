"""``hrm-deploy export``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.common import bundled_checkpoint, user_errors


@app.command()
@user_errors
def export(
    checkpoint: Optional[Path] = typer.Argument(
        None, help="step_N file, run folder, or our .pt; default: the bundled sudoku-small model (8 ACT steps)."
    ),
    output: Optional[Path] = typer.Option(
        None, "-o", "--out", "--output", help="Output .onnx (default export/<name>.onnx)."
    ),
    mode: str = typer.Option("unrolled", help="unrolled: all ACT steps in one graph; step: one segment, carry in/out."),
    steps: Optional[int] = typer.Option(None, help="ACT steps to unroll (default: halt_max_steps)."),
    max_batch: int = typer.Option(64, help="Largest batch the graph is meant for (engine profiles use it)."),
    opset: int = typer.Option(18, help="ONNX opset (>= 17)."),
    step_predictions: bool = typer.Option(False, help="Also output per-step argmax predictions [B, steps, S]."),
    parity: bool = typer.Option(True, help="Check parity against PyTorch on ONNX Runtime CPU."),
    seq_len: Optional[int] = typer.Option(None, help="Override/provide seq_len (upstream: from dataset.json)."),
    vocab_size: Optional[int] = typer.Option(None, help="Override/provide vocab_size."),
    num_puzzle_ids: Optional[int] = typer.Option(None, help="Override/provide num_puzzle_identifiers."),
    data_path: Optional[Path] = typer.Option(
        None, help="Dataset folder holding train/dataset.json (upstream checkpoints)."
    ),
    num_heads: Optional[int] = typer.Option(None, help="Override arch.num_heads (if all_config.yaml is absent)."),
    h_cycles: Optional[int] = typer.Option(None, help="Override arch.H_cycles."),
    l_cycles: Optional[int] = typer.Option(None, help="Override arch.L_cycles."),
    halt_max_steps: Optional[int] = typer.Option(None, help="Override arch.halt_max_steps."),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress display."),
) -> None:
    """Export a checkpoint to a checked, parity-tested FP32 ONNX graph with dynamic batch."""
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx

    if checkpoint is None:
        checkpoint = Path(bundled_checkpoint())
        typer.echo(f"no checkpoint given: exporting the bundled sudoku-small model ({checkpoint})", err=True)
    result = export_onnx(
        checkpoint,
        output,
        ExportConfig(
            mode=mode, steps=steps, max_batch=max_batch, opset=opset, step_predictions=step_predictions, parity=parity
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
