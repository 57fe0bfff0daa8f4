"""``hrm-deploy solve``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.choices import Provider
from hrm_deploy.cli.common import Quiet, Ray, RayAddress, RayWorkers, ray_config, user_errors


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
        Path | None,
        typer.Argument(
            help="Checkpoint, run folder, hf:ORG/NAME, ONNX (unrolled or step) or engine (default: the bundled model)."
        ),
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
    out: Annotated[
        str | None,  # a string, not a Path: "-o NEWDIR/" keeps its slash (a folder: refused, no default name)
        typer.Option("-o", "--out", help="Also write the output to this file."),
    ] = None,
    ray: Ray = False,
    address: RayAddress = None,
    workers: RayWorkers = None,
    quiet: Quiet = False,
) -> None:
    """Solve your own puzzles with a trained model and check the answers."""
    from hrm_deploy.registry import runner_options
    from hrm_deploy.solve import SolveInterrupted, format_solutions, solve as run_solve
    from hrm_deploy.sources import resolve_artifact

    artifact = resolve_artifact(artifact)  # before any work: run folders and hf:... -> their checkpoint file
    scale = ray_config(ray, address, workers)
    options: dict[str, Any] = runner_options(artifact, provider=provider.value) if artifact is not None else {}
    partial, out_file = None, None
    if out is not None:  # before any work: never a folder, over an input or over a user's file
        from hrm_deploy.manifest import output_path

        out_file = output_path(out, None)
        _check_out(out_file, puzzle, [artifact, calib_data])
        partial = PartialAnswers(out_file, json_lines)
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
            on_solutions=partial.append if partial is not None else None,
            ray=scale,
            **options,
        )
    except SolveInterrupted as stopped:  # Ctrl-C / SIGTERM: the answers so far are kept
        _write(format_solutions(stopped.solutions, json_lines), out_file, partial)
        typer.echo(
            f"interrupted: wrote the {len(stopped.solutions)} answers computed of {stopped.total} puzzles"
            + (f" (also to {out_file})" if out_file is not None else ""),
            err=True,
        )
        raise typer.Exit(130) from None
    _write(format_solutions(solutions, json_lines), out_file, partial)


class PartialAnswers:
    """``<out>.partial``: each batch's answers appended (and synced) as soon as they are computed,
    so a kill -9 loses at most the batch in flight; replaced by ``<out>`` when the run ends. An
    existing one is an interrupted run's answers: kept, and this run refuses to start over it."""

    def __init__(self, out: Path, json_lines: bool):
        import os

        from hrm_deploy.errors import ArtifactError

        self.path, self.json_lines = out.with_name(out.name + ".partial"), json_lines
        if os.path.lexists(self.path):
            raise ArtifactError(
                f"{self.path} holds the answers of an interrupted solve; move it away (or delete it) and run again"
            )

    def append(self, solutions: list) -> None:
        import os

        from hrm_deploy.io import append_line
        from hrm_deploy.solve import format_solutions

        # format_solutions joins answers with one newline: each batch appended as a line continues it
        append_line(self.path, format_solutions(solutions, self.json_lines).rstrip("\n"))
        with open(self.path, "rb") as f:
            os.fsync(f.fileno())

    def remove(self) -> None:
        import contextlib

        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def _check_out(out: Path, puzzle: str, inputs: list[Path | None]) -> None:
    """-o is never a folder, the puzzle file, the model or another input (through links too), never
    inside a dataset or run folder given as input, and never a file hrm-deploy did not write."""
    from hrm_deploy.outputs import check_user_output, run_folder

    given = Path(puzzle) if len(puzzle) < 4096 and "\n" not in puzzle and Path(puzzle).exists() else None
    folders = [given if given is not None and given.is_dir() else None, *(run_folder(i) for i in inputs)]
    check_user_output(out, inputs=[given, *inputs], folders=folders)


def _write(text: str, out: Path | None, partial: PartialAnswers | None = None) -> None:
    typer.echo(text, nl=False)
    if out is not None:
        from hrm_deploy.outputs import publish_output

        publish_output(out, text, stage="solve")
    if partial is not None:
        partial.remove()
