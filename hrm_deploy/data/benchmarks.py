"""Upstream HRM's benchmark builders, byte for byte: Sudoku-Extreme and Maze-30x30-Hard from CSV.

The published benchmarks (``sapientinc/sudoku-extreme``, ``sapientinc/maze-30x30-hard-1k`` on the
Hugging Face Hub) are CSV files ``{train,test}.csv`` with the columns ``source,question,answer,rating``.
Upstream's ``dataset/build_sudoku_dataset.py`` and ``build_maze_dataset.py`` turn them into the
dataset format (:mod:`hrm_deploy.data.format`); this module does the same, with the same results
for the same seed (checked against upstream's own outputs in ``tests/data/upstream/``):

- Sudoku: ``'.'`` -> ``0`` then every cell ``+ 1`` (0 pad, 1 blank, 2..10 digits); ``--min-difficulty``
  keeps rows with ``rating >=`` it (both splits); ``--subsample-size`` draws train rows without
  replacement; ``--num-aug`` adds that many shuffled variants per train puzzle (digit permutation,
  transpose, band/row and stack/column shuffles), the original first; test is never augmented.
- Maze: characters ``"# SGo"`` -> 1..5 (0 pad), the grid side from the first row; ``--aug`` adds the
  8 dihedral variants per train maze; ``--subsample-size`` as for Sudoku.

Randomness: upstream draws from numpy's global legacy generator and never seeds it. Here the same
draws, in the same order, come from ``np.random.RandomState(seed)``: with upstream's global
generator seeded to the same value (``np.random.seed(seed)``) the arrays are identical.

Dtypes follow upstream exactly, quirks included: inputs/labels are uint8, except a Sudoku train
split with ``--num-aug > 0``, which upstream writes as int64 (its digit map is an int64 array).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hrm_deploy.data.format import DatasetMetadata, Split, ensure_new_folder, save_dataset
from hrm_deploy.errors import DataError

MAZE_CHARSET = "# SGo"  # upstream's CHARSET: wall, open, start, goal, path -> ids 1..5
SPLITS = ("train", "test")
Progress = Callable[[int], None] | None


@dataclass(frozen=True)
class SudokuExtremeSpec:
    """Options of upstream's ``build_sudoku_dataset.py`` (same names), plus the seed it lacks."""

    subsample_size: int | None = None
    min_difficulty: int | None = None
    num_aug: int = 0
    seed: int = 0
    splits: tuple[str, ...] = SPLITS


@dataclass(frozen=True)
class MazeSpec:
    """Options of upstream's ``build_maze_dataset.py`` (same names), plus the seed it lacks."""

    subsample_size: int | None = None
    aug: bool = False
    seed: int = 0
    splits: tuple[str, ...] = SPLITS


def csv_files(source: str | Path, splits: tuple[str, ...]) -> dict[str, Path]:
    """``{split: csv}`` from a folder holding ``train.csv``/``test.csv``, or one ``<split>.csv`` file
    (then only that split is built)."""
    source = Path(source)
    bad = [s for s in splits if s not in SPLITS]
    if bad:
        raise DataError(f"unknown split {bad[0]!r}; choose from {', '.join(SPLITS)}")
    if source.is_file():
        if source.stem not in SPLITS:
            raise DataError(f"{source}: name the CSV train.csv or test.csv (upstream's names), or give its folder")
        return {source.stem: source}
    if not source.is_dir():
        raise DataError(f"{source} does not exist; give the folder holding train.csv and test.csv, or hf:ORG/NAME")
    files = {s: source / f"{s}.csv" for s in splits}
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise DataError(
            f"{missing[0]} not found; the benchmark folder must hold {', '.join(f'{s}.csv' for s in splits)}"
        )
    return files


def count_rows(path: Path) -> int:
    """Data rows of a CSV (lines minus the header; for a progress total)."""
    with open(path, "rb") as f:
        return max(0, sum(1 for _ in f) - 1)


def _rows(path: Path) -> Iterator[tuple[int, str, str, str]]:
    """``(line, question, answer, rating)`` of each row after the header, as upstream unpacks them."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        next(reader, None)  # header
        for line, row in enumerate(reader, start=2):
            if len(row) != 4:
                raise DataError(f"{path}:{line}: {len(row)} columns, expected 4 (source,question,answer,rating)")
            yield line, row[1], row[2], row[3]


def _subsample(items: list, size: int | None, rng: np.random.RandomState) -> list:
    """Upstream's train subsample: ``size`` distinct rows in the order drawn, only if fewer than all."""
    if size is not None and size < len(items):
        indices = rng.choice(len(items), size=size, replace=False)
        return [items[i] for i in indices]
    return items


def _shuffle_sudoku(board: np.ndarray, solution: np.ndarray, rng: np.random.RandomState):
    """Upstream's ``shuffle_sudoku``: the same draws in the same order (digit map, transpose,
    bands and their rows, stacks and their columns), applied to a 9x9 board and its solution."""
    digit_map = np.pad(rng.permutation(np.arange(1, 10)), (1, 0))  # int64, blank 0 kept
    transpose = rng.rand() < 0.5
    row_perm = np.concatenate([b * 3 + rng.permutation(3) for b in rng.permutation(3)])
    col_perm = np.concatenate([s * 3 + rng.permutation(3) for s in rng.permutation(3)])
    mapping = np.array([row_perm[i // 9] * 9 + col_perm[i % 9] for i in range(81)])

    def apply(x: np.ndarray) -> np.ndarray:
        x = x.T if transpose else x
        return digit_map[x.flatten()[mapping].reshape(9, 9)]

    return apply(board), apply(solution)


def _pack(inputs: list[np.ndarray], labels: list[np.ndarray], groups: int, seq_len: int, vocab: int) -> Split:
    """One example per puzzle, each original puzzle (with its variants) one group, identifier 0."""
    if not inputs:
        raise DataError("no rows left to build from (check --min-difficulty and the CSV)")
    per_group = len(inputs) // groups
    return Split(
        DatasetMetadata(seq_len=seq_len, vocab_size=vocab, total_groups=groups),
        np.concatenate(inputs).reshape(len(inputs), -1),
        np.concatenate(labels).reshape(len(labels), -1),
        np.zeros(len(inputs), dtype=np.int32),
        np.arange(len(inputs) + 1, dtype=np.int32),
        np.arange(0, len(inputs) + 1, per_group, dtype=np.int32),
    )


def _sudoku_grid(text: str, where: str, blank: bool) -> np.ndarray:
    if len(text) != 81:
        raise DataError(f"{where}: a Sudoku row has 81 cells, got {len(text)}")
    raw = (text.replace(".", "0") if blank else text).encode("ascii", "replace")
    grid = np.frombuffer(raw, dtype=np.uint8).reshape(9, 9) - ord("0")
    if grid.max() > 9:  # uint8: a character below '0' wraps above 9 too
        raise DataError(f"{where}: cells must be digits 0-9 (or '.' in the question), got {text[:20]!r}...")
    return grid


def sudoku_split(
    path: Path, split: str, spec: SudokuExtremeSpec, rng: np.random.RandomState, progress: Progress
) -> Split:
    """One split of upstream's Sudoku-Extreme build (draws from ``rng`` as upstream does)."""
    pairs = []
    for line, question, answer, rating in _rows(path):
        where = f"{path}:{line}"
        try:
            keep = spec.min_difficulty is None or int(rating) >= spec.min_difficulty
        except ValueError:
            raise DataError(f"{where}: rating {rating!r} is not an integer") from None
        if keep:
            pairs.append((_sudoku_grid(question, where, True), _sudoku_grid(answer, where, False)))
        if progress:
            progress(1)
    if split == "train":
        pairs = _subsample(pairs, spec.subsample_size, rng)
    augments = spec.num_aug if split == "train" else 0
    inputs, labels = [], []
    for board, solution in pairs:
        for aug in range(1 + augments):
            x, y = (board, solution) if aug == 0 else _shuffle_sudoku(board, solution, rng)
            inputs.append(x)
            labels.append(y)
    result = _pack(inputs, labels, len(pairs), 81, 11)
    result.inputs += 1  # 0 pad, 1 blank, 2..10 the digits (dtype kept: upstream's uint8 or int64)
    result.labels += 1
    return result


def _dihedral(grid: np.ndarray, k: int) -> np.ndarray:
    """Upstream's ``dihedral_transform`` ids 0..7 (identity, rot90 x1..3, flip lr, flip ud,
    transpose, anti-diagonal)."""
    ops = (
        lambda a: a,
        lambda a: np.rot90(a, 1),
        lambda a: np.rot90(a, 2),
        lambda a: np.rot90(a, 3),
        np.fliplr,
        np.flipud,
        lambda a: a.T,
        lambda a: np.fliplr(np.rot90(a, 1)),
    )
    return ops[k](grid)


def maze_split(path: Path, split: str, spec: MazeSpec, rng: np.random.RandomState, progress: Progress) -> Split:
    """One split of upstream's maze build (draws from ``rng`` as upstream does)."""
    char2id = np.zeros(256, np.uint8)
    char2id[np.array([ord(c) for c in MAZE_CHARSET])] = np.arange(len(MAZE_CHARSET)) + 1
    side = None
    pairs = []
    for line, question, answer, _rating in _rows(path):
        where = f"{path}:{line}"
        if side is None:
            side = int(len(question) ** 0.5)
        unknown = (set(question) | set(answer)) - set(MAZE_CHARSET)
        if unknown:
            raise DataError(f"{where}: characters {sorted(unknown)} are not in the maze alphabet {MAZE_CHARSET!r}")
        if len(question) != side * side or len(answer) != side * side:
            raise DataError(
                f"{where}: {len(question)} cells, but the first row makes {side}x{side} grids ({side * side})"
            )
        grids = [np.frombuffer(t.encode(), dtype=np.uint8).reshape(side, side) for t in (question, answer)]
        pairs.append((grids[0], grids[1]))
        if progress:
            progress(1)
    if split == "train":
        pairs = _subsample(pairs, spec.subsample_size, rng)
    variants = range(8 if split == "train" and spec.aug else 1)
    inputs = [char2id[_dihedral(x, k).reshape(-1)] for x, _ in pairs for k in variants]
    labels = [char2id[_dihedral(y, k).reshape(-1)] for _, y in pairs for k in variants]
    return _pack(inputs, labels, len(pairs), int(math.prod((side or 0, side or 0))), len(MAZE_CHARSET) + 1)


def build_benchmark(
    source: str | Path, output: str | Path | None, spec: SudokuExtremeSpec | MazeSpec, progress: Progress = None
) -> dict[str, Split]:
    """Build Sudoku-Extreme (a :class:`SudokuExtremeSpec`) or a maze set (a :class:`MazeSpec`) from ``source`` (folder of CSVs, or one
    ``<split>.csv``) and write it to ``output`` in upstream's format when given. Train is built
    before test, as upstream does, so the random draws line up."""
    files = csv_files(source, spec.splits)
    if output is not None:
        ensure_new_folder(output)  # before any work
    rng = np.random.RandomState(spec.seed)
    splits: dict[str, Split] = {}
    for name in SPLITS:
        if name in files:
            if isinstance(spec, SudokuExtremeSpec):
                splits[name] = sudoku_split(files[name], name, spec, rng, progress)
            else:
                splits[name] = maze_split(files[name], name, spec, rng, progress)
    if output is not None:
        save_dataset(output, splits, ["<blank>"])
    return splits


def _looks_like_sudoku(csv_path: Path) -> bool:
    """Sudoku (81 cells of digits and '.') or maze (the "# SGo" alphabet), from the first row."""
    for _line, question, _answer, _rating in _rows(csv_path):
        return len(question) == 81 and set(question) <= set(".0123456789")
    raise DataError(f"{csv_path} has no rows after its header")


def _cache_key(files: dict[str, Path]) -> str:
    """A cache folder name for the dataset built from ``files``: the Hub repository and commit when
    they come from the Hub cache, else a hash of the CSVs' paths, sizes and times."""
    from hrm_deploy.io import sha256_bytes
    from hrm_deploy.sources import hub_origin

    first = next(iter(files.values()))
    origin = hub_origin(first, files=())
    if origin is not None:
        base = f"{origin['repo'].replace('/', '--')}-{origin['commit'][:12]}"
    else:
        stamp = "|".join(f"{p.absolute()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files.values())
        base = f"{first.parent.name}-{sha256_bytes(stamp.encode())[:12]}"
    return f"{base}-{'+'.join(files)}"


def prepare_dataset(spec: str | Path | None, splits: tuple[str, ...] = ("test",), quiet: bool = False) -> Path | None:
    """The dataset folder (upstream format) a ``--data`` argument names, before any work: a path or
    ``hf:ORG/NAME`` resolved by :mod:`hrm_deploy.sources`; a folder of benchmark CSVs (a published
    benchmark's snapshot) or one ``<split>.csv`` is built once with upstream's builder defaults
    (no subsample, no augmentation, seed 0) into the user cache (``splits`` only: the test split
    for verify/bench), with a progress display, and that folder is returned."""
    from hrm_deploy.io import cache_dir
    from hrm_deploy.progress import progress
    from hrm_deploy.sources import resolve_data

    if spec is None:
        return None
    path = resolve_data(spec)
    benchmark_folder = path.is_dir() and not (path / "test" / "dataset.json").is_file() and any(path.glob("*.csv"))
    if not (benchmark_folder or (path.is_file() and path.suffix == ".csv")):
        return path  # a dataset folder, an .npz, or nothing there: the reader says what is wrong
    files = csv_files(path, splits if path.is_dir() else (path.stem,))
    target = cache_dir("datasets", _cache_key(files))
    if (target / next(iter(files)) / "dataset.json").is_file():
        return target
    first = next(iter(files.values()))
    benchmark: SudokuExtremeSpec | MazeSpec = (
        SudokuExtremeSpec(splits=tuple(files)) if _looks_like_sudoku(first) else MazeSpec(splits=tuple(files))
    )
    total = sum(count_rows(p) for p in files.values())
    with progress(total, f"building {' and '.join(files)} split of {spec}", quiet=quiet, unit="rows") as advance:
        build_benchmark(path, target, benchmark, advance)
    return target
