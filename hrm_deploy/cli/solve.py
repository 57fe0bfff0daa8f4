"""``hrm-deploy solve``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.common import user_errors


@app.command()
@user_errors
def solve(
    puzzle: str = typer.Argument(
        ...,
        help="An 81-character Sudoku (0 or . for blanks), a maze of '# SGo' lines, "
        "a text file with one puzzle per line, or a dataset folder.",
    ),
    artifact: Path | None = typer.Argument(
        None, help="Checkpoint, ONNX (unrolled or step) or engine (default: the bundled model)."
    ),
    halt: str = typer.Option(
        "off",
        help="Early halting: off, q (q_halt > q_continue), threshold:X "
        "(sigmoid(q_halt) > X) or budget:P (calibrated, see verify --halt).",
    ),
    min_steps: int = typer.Option(1, help="Halting: never stop before this ACT step."),
    max_steps: int | None = typer.Option(None, help="Halting: always stop at this ACT step."),
    json_lines: bool = typer.Option(False, "--json", help="JSON lines: answer, steps_used, q_halt, validity."),
    url: str | None = typer.Option(None, help="Ask a running hrm-deploy server instead of loading a model."),
    calib_data: Path | None = typer.Option(
        None,
        help="budget:P: data to calibrate on when the artifact has no "
        "stored threshold (default: fresh puzzles of the checkpoint's "
        "dataset spec).",
    ),
    provider: str = typer.Option("cpu", help="ONNX Runtime provider for .onnx: cpu, cuda or tensorrt."),
    out: Path | None = typer.Option(None, "-o", "--out", help="Also write the output to this file."),
) -> None:
    """Solve your own puzzles with a trained model and check the answers."""
    from hrm_deploy.solve import format_solutions, solve as run_solve

    options: dict[str, Any] = {"provider": provider} if artifact is not None and artifact.suffix == ".onnx" else {}
    solutions = run_solve(
        puzzle, artifact, halt, min_steps=min_steps, max_steps=max_steps, url=url, calib_data=calib_data, **options
    )
    text = format_solutions(solutions, json_lines)
    typer.echo(text, nl=False)
    if out is not None:
        from hrm_deploy.io import atomic_path

        with atomic_path(out) as tmp:
            tmp.write_text(text)
