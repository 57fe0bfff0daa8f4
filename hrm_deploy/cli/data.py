"""``hrm-deploy data ...``: build datasets in upstream's format."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.common import user_errors

data_app = typer.Typer(help="Build datasets in upstream HRM's on-disk format.", no_args_is_help=True)
app.add_typer(data_app, name="data")


def _generate(label: str, total: int, run: Callable, output: Path) -> None:
    """Run a generator under a progress display (a bar, or ETA lines in a log) and report what it wrote."""
    from hrm_deploy.progress import progress

    with progress(total, label, unit="examples") as advance:
        splits = run(advance)
    typer.echo(f"wrote {output}: {len(splits['train'])} train examples, {len(splits['test'])} test examples")


@data_app.command("sudoku")
@user_errors
def sudoku(
    output: Path = typer.Option(Path("data/sudoku-gen"), "-o", "--out", "--output", help="Dataset folder to create."),
    train: int = typer.Option(1000, help="Original train puzzles (each one group)."),
    test: int = typer.Option(200, help="Test puzzles (never augmented)."),
    min_blanks: int = typer.Option(10, help="Fewest empty cells per puzzle."),
    max_blanks: int = typer.Option(20, help="Most empty cells per puzzle (difficulty)."),
    augment: int = typer.Option(0, help="Augmented variants per train puzzle (upstream's --num-aug)."),
    seed: int = typer.Option(0, help="Random seed (same seed, same dataset)."),
    workers: int = typer.Option(0, help="Processes (0: one per CPU); the dataset does not depend on it."),
    min_rating: int = typer.Option(0, help="Fewest solver search nodes (difficulty by solver effort; 0: no bound)."),
    max_rating: int = typer.Option(0, help="Most solver search nodes (0: no bound)."),
) -> None:
    """Generate unique-solution Sudoku puzzles with a chosen number of blanks."""
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    spec = SudokuSpec(
        train=train,
        test=test,
        blanks=(min_blanks, max_blanks),
        augment=augment,
        seed=seed,
        workers=workers,
        rating=(min_rating, max_rating),
    )
    _generate("generating puzzles", train + test, lambda progress: generate_sudoku(spec, str(output), progress), output)


@data_app.command("maze")
@user_errors
def maze(
    output: Path = typer.Option(Path("data/maze-gen"), "-o", "--out", "--output", help="Dataset folder to create."),
    train: int = typer.Option(1000, help="Train mazes (each one group)."),
    test: int = typer.Option(200, help="Test mazes (never augmented)."),
    size: int = typer.Option(30, help="Grid side N (seq_len N*N)."),
    min_path: int = typer.Option(0, help="Shortest start-goal path, in cells (difficulty)."),
    aug: bool = typer.Option(False, "--aug", help="8 dihedral variants per train maze (upstream's --aug)."),
    seed: int = typer.Option(0, help="Random seed (same seed, same dataset)."),
) -> None:
    """Generate N x N mazes with start, goal and the unique shortest path as the label."""
    from hrm_deploy.data.maze import MazeSpec, generate_maze

    spec = MazeSpec(train=train, test=test, size=size, min_path=min_path, augment=aug, seed=seed)
    _generate("generating mazes", train + test, lambda progress: generate_maze(spec, str(output), progress), output)
