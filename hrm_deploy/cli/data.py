"""``hrm-deploy data ...``: build datasets in upstream's format."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.common import App, user_errors

data_app = App(help="Build datasets in upstream HRM's on-disk format.", no_args_is_help=True)
app.add_typer(data_app, name="data")

_OUT = typer.Option("-o", "--out", "--output", help="Dataset folder to create.")
_SEED = typer.Option(help="Random seed (same seed, same dataset).")


def _generate(label: str, total: int, run: Callable, output: Path) -> None:
    """Run a generator under a progress display (a bar, or ETA lines in a log) and report what it wrote."""
    from hrm_deploy.progress import progress

    with progress(total, label, unit="examples") as advance:
        splits = run(advance)
    typer.echo(f"wrote {output}: {len(splits['train'])} train examples, {len(splits['test'])} test examples")


@data_app.command("sudoku")
@user_errors
def sudoku(
    output: Annotated[Path, _OUT] = Path("data/sudoku-gen"),
    train: Annotated[int, typer.Option(help="Original train puzzles (each one group).")] = 1000,
    test: Annotated[int, typer.Option(help="Test puzzles (never augmented).")] = 200,
    min_blanks: Annotated[int, typer.Option(help="Fewest empty cells per puzzle.")] = 10,
    max_blanks: Annotated[int, typer.Option(help="Most empty cells per puzzle (difficulty).")] = 20,
    augment: Annotated[int, typer.Option(help="Augmented variants per train puzzle (upstream's --num-aug).")] = 0,
    seed: Annotated[int, _SEED] = 0,
    workers: Annotated[int, typer.Option(help="Processes (0: one per CPU); the dataset does not depend on it.")] = 0,
    min_rating: Annotated[
        int, typer.Option(help="Fewest solver search nodes (difficulty by solver effort; 0: no bound).")
    ] = 0,
    max_rating: Annotated[int, typer.Option(help="Most solver search nodes (0: no bound).")] = 0,
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
    output: Annotated[Path, _OUT] = Path("data/maze-gen"),
    train: Annotated[int, typer.Option(help="Train mazes (each one group).")] = 1000,
    test: Annotated[int, typer.Option(help="Test mazes (never augmented).")] = 200,
    size: Annotated[int, typer.Option(help="Grid side N (seq_len N*N).")] = 30,
    min_path: Annotated[int, typer.Option(help="Shortest start-goal path, in cells (difficulty).")] = 0,
    aug: Annotated[bool, typer.Option("--aug", help="8 dihedral variants per train maze (upstream's --aug).")] = False,
    seed: Annotated[int, _SEED] = 0,
) -> None:
    """Generate N x N mazes with start, goal and the unique shortest path as the label."""
    from hrm_deploy.data.maze import MazeSpec, generate_maze

    spec = MazeSpec(train=train, test=test, size=size, min_path=min_path, augment=aug, seed=seed)
    _generate("generating mazes", train + test, lambda progress: generate_maze(spec, str(output), progress), output)
