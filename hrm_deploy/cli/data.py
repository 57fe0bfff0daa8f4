"""``hrm-deploy data ...``: build datasets in upstream's format."""

from __future__ import annotations

from pathlib import Path

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.common import user_errors

data_app = typer.Typer(help="Build datasets in upstream HRM's on-disk format.", no_args_is_help=True)
app.add_typer(data_app, name="data")


@data_app.command("sudoku")
@user_errors
def sudoku(
    output: Path = typer.Option(Path("data/sudoku-gen"), "-o", "--output", help="Dataset folder to create."),
    train: int = typer.Option(1000, help="Original train puzzles (each one group)."),
    test: int = typer.Option(200, help="Test puzzles (never augmented)."),
    min_blanks: int = typer.Option(10, help="Fewest empty cells per puzzle."),
    max_blanks: int = typer.Option(20, help="Most empty cells per puzzle (difficulty)."),
    augment: int = typer.Option(0, help="Augmented variants per train puzzle (upstream's --num-aug)."),
    seed: int = typer.Option(0, help="Random seed (same seed, same dataset)."),
    workers: int = typer.Option(0, help="Processes (0: one per CPU); the dataset does not depend on it."),
) -> None:
    """Generate unique-solution Sudoku puzzles with a chosen number of blanks."""
    from rich.progress import Progress

    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    spec = SudokuSpec(train=train, test=test, blanks=(min_blanks, max_blanks), augment=augment, seed=seed, workers=workers)
    with Progress(transient=True) as bar:
        task = bar.add_task("generating puzzles", total=train + test)
        splits = generate_sudoku(spec, str(output), progress=lambda n: bar.advance(task, n))
    typer.echo(f"wrote {output}: {len(splits['train'])} train examples, {len(splits['test'])} test examples")
