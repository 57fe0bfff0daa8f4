"""``hrm-deploy data ...``: build datasets in upstream's format."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.common import App, Quiet, user_errors

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


_SOURCE = (
    "Folder holding train.csv and test.csv, one <split>.csv, or hf:ORG/NAME (optionally @REVISION; a Hub dataset)."
)
_SUBSAMPLE = typer.Option(help="Train rows drawn without replacement (upstream's --subsample-size; default all).")
_UPSTREAM_SEED = typer.Option(help="Seed of numpy's legacy generator (upstream leaves it unseeded).")
_SPLITS = typer.Option(help="Splits to build, comma-separated (train first, as upstream: same random draws).")


def _build_benchmark(source: str, output: Path, spec, quiet: bool) -> None:
    """Resolve the source (Hub snapshot or local CSVs) before any work, then build under a progress display."""
    from hrm_deploy.data.benchmarks import build_benchmark, count_rows, csv_files
    from hrm_deploy.data.format import ensure_new_folder
    from hrm_deploy.progress import progress
    from hrm_deploy.sources import resolve_data

    ensure_new_folder(output)
    folder = resolve_data(source)
    total = sum(count_rows(p) for p in csv_files(folder, spec.splits).values())
    with progress(total, f"building {output} from {source}", quiet=quiet, unit="rows") as advance:
        splits = build_benchmark(folder, output, spec, advance)
    typer.echo(f"wrote {output}: " + ", ".join(f"{len(s)} {name} examples" for name, s in splits.items()))


def _splits(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


@data_app.command("sudoku-extreme")
@user_errors
def sudoku_extreme(
    output: Annotated[Path, _OUT] = Path("data/sudoku-extreme-full"),
    source: Annotated[str, typer.Option(help=_SOURCE)] = "hf:sapientinc/sudoku-extreme",
    subsample_size: Annotated[int | None, _SUBSAMPLE] = None,
    min_difficulty: Annotated[
        int | None, typer.Option(help="Keep rows whose rating is at least this (both splits; upstream's).")
    ] = None,
    num_aug: Annotated[
        int, typer.Option(help="Shuffled variants per train puzzle (digits, transpose, bands, stacks); test never.")
    ] = 0,
    seed: Annotated[int, _UPSTREAM_SEED] = 0,
    splits: Annotated[str, _SPLITS] = "train,test",
    quiet: Quiet = False,
) -> None:
    """Sudoku-Extreme exactly as upstream's dataset/build_sudoku_dataset.py builds it (same arrays per seed)."""
    from hrm_deploy.data.benchmarks import SudokuExtremeSpec

    spec = SudokuExtremeSpec(subsample_size, min_difficulty, num_aug, seed, _splits(splits))
    _build_benchmark(source, output, spec, quiet)


@data_app.command("maze-30x30-hard")
@user_errors
def maze_30x30_hard(
    output: Annotated[Path, _OUT] = Path("data/maze-30x30-hard-1k"),
    source: Annotated[str, typer.Option(help=_SOURCE)] = "hf:sapientinc/maze-30x30-hard-1k",
    subsample_size: Annotated[int | None, _SUBSAMPLE] = None,
    aug: Annotated[
        bool, typer.Option("--aug", help="The 8 dihedral variants per train maze (upstream's --aug).")
    ] = False,
    seed: Annotated[int, _UPSTREAM_SEED] = 0,
    splits: Annotated[str, _SPLITS] = "train,test",
    quiet: Quiet = False,
) -> None:
    """Maze-30x30-Hard exactly as upstream's dataset/build_maze_dataset.py builds it (same arrays per seed)."""
    from hrm_deploy.data.benchmarks import MazeSpec

    _build_benchmark(source, output, MazeSpec(subsample_size, aug, seed, _splits(splits)), quiet)
