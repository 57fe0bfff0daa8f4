"""Sudoku generator in upstream's encoding (0 pad, 1 blank, 2..10 digits 1..9).

Puzzles have a unique solution (checked by an exact solver) and a chosen number of
blanks; train puzzles get upstream's augmentations (digit permutation, transpose,
band/row and stack/column shuffles), each original puzzle forming one group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hrm_deploy.data.format import Split, check_dataset_size, ensure_new_folder, pack_groups, save_dataset
from hrm_deploy.errors import ConfigError

_BOX = [(r // 3) * 3 + c // 3 for r in range(9) for c in range(9)]
_FULL = 0x3FE  # bits 1..9


def count_solutions(grid: list[int], limit: int = 2) -> tuple[int, int]:
    """Number of solutions of ``grid`` (81 ints, 0 = blank) up to ``limit``, and the
    number of search nodes visited (the difficulty rating by solver effort)."""
    rows, cols, boxes = [0] * 9, [0] * 9, [0] * 9
    blanks = []
    for i, v in enumerate(grid):
        if v:
            bit = 1 << v
            r, c, b = i // 9, i % 9, _BOX[i]
            if rows[r] & bit or cols[c] & bit or boxes[b] & bit:
                return 0, 0
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
        else:
            blanks.append(i)
    found = 0
    nodes = 0

    def search() -> None:
        nonlocal found, nodes
        nodes += 1
        best, best_options, best_count = -1, 0, 10
        for i in blanks:  # most-constrained cell first
            if grid[i]:
                continue
            options = _FULL & ~(rows[i // 9] | cols[i % 9] | boxes[_BOX[i]])
            count = bin(options).count("1")
            if count < best_count:
                best, best_options, best_count = i, options, count
                if count <= 1:
                    break
        if best < 0:
            found += 1
            return
        r, c, b = best // 9, best % 9, _BOX[best]
        while best_options and found < limit:
            bit = best_options & -best_options
            best_options ^= bit
            grid[best] = bit.bit_length() - 1
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            search()
            rows[r] ^= bit
            cols[c] ^= bit
            boxes[b] ^= bit
            grid[best] = 0

    search()
    return found, nodes


def random_solution(rng: np.random.Generator) -> np.ndarray:
    """A uniformly shuffled valid grid: base pattern under the Sudoku symmetry group."""
    base = np.array([[(r * 3 + r // 3 + c) % 9 + 1 for c in range(9)] for r in range(9)], dtype=np.uint8)
    return shuffle_sudoku(base, base, rng)[1]


def shuffle_sudoku(board: np.ndarray, solution: np.ndarray, rng: np.random.Generator):
    """Upstream's augmentation: digit permutation, optional transpose, band/row and stack/column shuffles."""
    digit_map = np.pad(rng.permutation(np.arange(1, 10)), (1, 0)).astype(np.uint8)  # blank 0 stays 0
    transpose = rng.random() < 0.5
    bands = rng.permutation(3)
    row_perm = np.concatenate([b * 3 + rng.permutation(3) for b in bands])
    stacks = rng.permutation(3)
    col_perm = np.concatenate([s * 3 + rng.permutation(3) for s in stacks])
    mapping = np.array([row_perm[i // 9] * 9 + col_perm[i % 9] for i in range(81)])

    def apply(x: np.ndarray) -> np.ndarray:
        if transpose:
            x = x.T
        return digit_map[x.flatten()[mapping].reshape(9, 9)]

    return apply(board), apply(solution)


@dataclass(frozen=True)
class SudokuSpec:
    """What to generate. ``blanks`` is a (min, max) range of empty cells per puzzle."""

    train: int = 1000
    test: int = 200
    blanks: tuple[int, int] = (10, 20)
    augment: int = 0  # augmented variants per train puzzle (upstream's --num-aug)
    seed: int = 0
    workers: int = 0  # processes (0: one per CPU); the output does not depend on it
    rating: tuple[int, int] = (0, 0)  # solver search nodes (min, max); 0 = no bound (difficulty by effort)

    def __post_init__(self) -> None:
        lo, hi = self.blanks
        if not 1 <= lo <= hi <= 64:
            raise ConfigError(
                f"blanks {self.blanks} must satisfy 1 <= min <= max <= 64 (a unique Sudoku has at least 17 givens)"
            )
        if self.train < 0 or self.test < 0 or self.augment < 0 or self.workers < 0:
            raise ConfigError("counts must be >= 0")
        if self.rating[0] < 0 or self.rating[1] < 0 or (self.rating[1] and self.rating[0] > self.rating[1]):
            raise ConfigError(f"rating {self.rating} must be 0 <= min <= max (0 = no bound)")


def make_puzzle(rng: np.random.Generator, blanks: int, max_tries: int = 50) -> tuple[np.ndarray, np.ndarray, int]:
    """(board with ``blanks`` zeros, solution, solver nodes) with a unique solution.

    Cells are emptied one at a time in random order, keeping a removal only while the
    solution stays unique; a grid that runs out of removable cells is replaced."""
    for _ in range(max_tries):
        solution = random_solution(rng)
        board = solution.flatten().tolist()
        removed = 0
        for cell in rng.permutation(81):
            board[cell] = 0
            if count_solutions(list(board))[0] == 1:
                removed += 1
                if removed == blanks:
                    nodes = count_solutions(list(board))[1]
                    return np.array(board, dtype=np.uint8).reshape(9, 9), solution, nodes
            else:
                board[cell] = int(solution.flat[cell])
    raise ConfigError(f"could not make a unique puzzle with {blanks} blanks in {max_tries} tries; use fewer blanks")


def _split(boards: list[list[np.ndarray]], solutions: list[list[np.ndarray]]) -> Split:
    """Upstream's arrays; +1 shifts digits 0..9 (0 = blank) to tokens 1..10 (0 = pad)."""
    return pack_groups(
        [[b + 1 for b in g] for g in boards], [[s + 1 for s in g] for g in solutions], seq_len=81, vocab_size=11
    )


def _make_group(job: tuple[SudokuSpec, int, int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Puzzle ``index`` of split ``split_id`` and its augmentations, from its own RNG stream
    (so the dataset is the same whatever the number of worker processes)."""
    spec, split_id, index = job
    rng = np.random.default_rng([spec.seed, split_id, index])
    lo, hi = spec.blanks
    low, high = spec.rating
    for _ in range(1000):  # rejection sampling on the solver-effort rating
        board, solution, nodes = make_puzzle(rng, int(rng.integers(lo, hi + 1)))
        if nodes >= low and (not high or nodes <= high):
            break
    else:
        raise ConfigError(
            f"no puzzle with {lo}-{hi} blanks rated {low}-{high or 'any'} solver nodes in 1000 tries; "
            "widen --min-rating/--max-rating or change the blanks"
        )
    group_b, group_s = [board], [solution]
    for _ in range(spec.augment if split_id == 0 else 0):
        b, s = shuffle_sudoku(board, solution, rng)
        group_b.append(b)
        group_s.append(s)
    return group_b, group_s


def generate_sudoku(spec: SudokuSpec, output: str | None = None, progress=None) -> dict[str, Split]:
    """Generate train/test splits (and write them to ``output`` in upstream's format if given),
    in ``spec.workers`` processes."""
    import gc
    from concurrent.futures import ProcessPoolExecutor

    from hrm_deploy.system import check_threads, die_with_parent, usable_cores

    check_threads(spec.workers or None, "--workers")
    check_dataset_size(spec.train * (1 + spec.augment) + spec.test, 81, output)
    if output:
        ensure_new_folder(output)  # fail before the work, not after it
    workers = min(spec.workers or usable_cores(), max(1, (spec.train + spec.test) // 64))
    splits = {}
    # Workers die with this process (kill -9 included): never orphaned, never deadlocked on a dead pipe.
    pool = None
    if workers > 1:
        # The workers are forked: every object this process holds is copied into them, and a copy the
        # child's garbage collector frees can hang it (an ONNX Runtime session's destructor waits on
        # its thread pool, whose threads the child does not have). Frozen objects are never collected.
        gc.freeze()
        pool = ProcessPoolExecutor(workers, initializer=die_with_parent)
    try:
        for split_id, (name, count) in enumerate((("train", spec.train), ("test", spec.test))):
            jobs = [(spec, split_id, i) for i in range(count)]
            groups = pool.map(_make_group, jobs, chunksize=64) if pool else map(_make_group, jobs)
            boards, solutions = [], []
            for group_b, group_s in groups:
                boards.append(group_b)
                solutions.append(group_s)
                if progress:
                    progress(1)
            splits[name] = _split(boards, solutions)
    finally:
        if pool:  # on Ctrl-C / SIGTERM: drop the queued chunks, wait only for the running ones
            pool.shutdown(cancel_futures=True)
            gc.unfreeze()
    if output:
        save_dataset(output, splits, ["<blank>"])
    return splits
