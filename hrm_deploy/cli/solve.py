"""``hrm-deploy solve``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.choices import Provider
from hrm_deploy.cli.common import Quiet, user_errors


@app.command()
@user_errors
def solve(
    puzzle: Annotated[
        str,
        typer.Argument(
            help="An 81-character Sudoku (0 or . for blanks), a maze of '# SGo' lines, "
            "a text file with one puzzle per line, or a dataset folder.",
        ),
    ],
    artifact: Annotated[
        Path | None, typer.Argument(help="Checkpoint, ONNX (unrolled or step) or engine (default: the bundled model).")
    ] = None,
    halt: Annotated[
        str,
        typer.Option(
            help="Early halting: off, q (the model's own rule: q_halt > q_continue, or q_halt > 0 if trained with no_ACT_continue), threshold:X "
            "(sigmoid(q_halt) > X) or budget:P (calibrated, see verify --halt).",
        ),
    ] = "off",
    min_steps: Annotated[int, typer.Option(help="Halting: never stop before this ACT step.")] = 1,
    max_steps: Annotated[int | None, typer.Option(help="Halting: always stop at this ACT step.")] = None,
    json_lines: Annotated[
        bool, typer.Option("--json", help="JSON lines: answer, steps_used, q_halt, validity.")
    ] = False,
    url: Annotated[str | None, typer.Option(help="Ask a running hrm-deploy server instead of loading a model.")] = None,
    calib_data: Annotated[
        Path | None,
        typer.Option(
            help="budget:P: data to calibrate on when the artifact has no "
            "stored threshold (default: fresh puzzles of the checkpoint's "
            "dataset spec).",
        ),
    ] = None,
    provider: Annotated[Provider, typer.Option(help="ONNX Runtime provider for .onnx.")] = Provider.CPU,
    out: Annotated[Path | None, typer.Option("-o", "--out", help="Also write the output to this file.")] = None,
    quiet: Quiet = False,
) -> None:
    """Solve your own puzzles with a trained model and check the answers."""
    from hrm_deploy.registry import runner_options
    from hrm_deploy.solve import SolveInterrupted, format_solutions, solve as run_solve

    options: dict[str, Any] = runner_options(artifact, provider=provider.value) if artifact is not None else {}
    if out is not None:  # before any work: never over the puzzles, never over a folder
        from hrm_deploy.io import check_output_path

        _check_out(out, puzzle, [artifact, calib_data])
        check_output_path(out)
    try:
        solutions = run_solve(
            puzzle,
            artifact,
            halt,
            min_steps=min_steps,
            max_steps=max_steps,
            url=url,
            calib_data=calib_data,
            quiet=quiet,
            **options,
        )
    except SolveInterrupted as stopped:  # Ctrl-C / SIGTERM: the answers so far are kept
        _write(format_solutions(stopped.solutions, json_lines), out)
        typer.echo(
            f"interrupted: wrote the {len(stopped.solutions)} answers computed of {stopped.total} puzzles"
            + (f" (also to {out})" if out is not None else ""),
            err=True,
        )
        raise typer.Exit(130) from None
    _write(format_solutions(solutions, json_lines), out)


def _check_out(out: Path, puzzle: str, inputs: list[Path | None]) -> None:
    """-o is never a folder, the puzzle file, the model or any other input (through links too)."""
    from hrm_deploy.errors import ConfigError
    from hrm_deploy.io import same_file
    from hrm_deploy.manifest import manifest_path

    if out.is_dir():
        raise ConfigError(f"-o {out} is a folder; give a file name for the answers")
    if not out.exists():
        return
    if len(puzzle) < 4096 and "\n" not in puzzle and Path(puzzle).exists() and same_file(out, puzzle):
        raise ConfigError(f"-o {out} is the puzzle file itself; write the answers elsewhere")
    for given in inputs:
        if given is not None and given.exists():
            for src in (given, manifest_path(given)):
                if src.exists() and same_file(out, src):
                    raise ConfigError(f"-o {out} is the input {src}; write the answers elsewhere")


def _write(text: str, out: Path | None) -> None:
    typer.echo(text, nl=False)
    if out is not None:
        from hrm_deploy.io import atomic_path

        with atomic_path(out) as tmp:
            tmp.write_text(text)
