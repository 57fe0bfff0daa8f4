"""Maze generator in upstream's encoding: ``"# SGo"`` -> 1..5 (wall, open, start, goal,
path), 0 = pad, ``seq_len = N*N``, vocab 6, one puzzle identifier.

A perfect maze (one path between any two cells, so the shortest path is unique) is carved
by a randomized depth-first search; start and goal are the two ends of a longest path found
by a double breadth-first search ("hard": long paths), optionally at least ``min_path`` long.
Input: walls, open cells, S and G. Label: the same grid with the shortest path's cells as
``o``. Train mazes can get upstream's 8 dihedral variants (``--aug``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from hrm_deploy.data.format import Split, check_dataset_size, ensure_new_folder, pack_groups, save_dataset
from hrm_deploy.errors import ConfigError

WALL, OPEN, START, GOAL, PATH = 1, 2, 3, 4, 5  # "# SGo"


@dataclass(frozen=True)
class MazeSpec:
    train: int = 1000
    test: int = 200
    size: int = 30
    min_path: int = 0  # shortest S-G path length in cells (0: whatever the longest path is)
    augment: bool = False  # 8 dihedral variants per train maze (upstream's --aug)
    seed: int = 0

    def __post_init__(self) -> None:
        if not 5 <= self.size <= 64:
            raise ConfigError(f"maze size {self.size} must be between 5 and 64")
        if self.train < 0 or self.test < 0 or self.min_path < 0:
            raise ConfigError("counts and min_path must be >= 0")


def _carve(size: int, rng: np.random.Generator) -> np.ndarray:
    grid = np.full((size, size), WALL, dtype=np.uint8)
    cells = range(1, size - 1, 2)
    start = (int(rng.choice(list(cells))), int(rng.choice(list(cells))))
    grid[start] = OPEN
    stack = [start]
    while stack:
        r, c = stack[-1]
        options = [
            (dr, dc)
            for dr, dc in ((-2, 0), (2, 0), (0, -2), (0, 2))
            if 1 <= r + dr < size - 1 and 1 <= c + dc < size - 1 and grid[r + dr, c + dc] == WALL
        ]
        if not options:
            stack.pop()
            continue
        dr, dc = options[int(rng.integers(len(options)))]
        grid[r + dr // 2, c + dc // 2] = OPEN
        grid[r + dr, c + dc] = OPEN
        stack.append((r + dr, c + dc))
    return grid


def _bfs(grid: np.ndarray, source: tuple[int, int]) -> dict[tuple[int, int], tuple[int, int] | None]:
    parents: dict[tuple[int, int], tuple[int, int] | None] = {source: None}
    queue = deque([source])
    while queue:
        r, c = queue.popleft()
        for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if grid[nr, nc] != WALL and (nr, nc) not in parents:
                parents[(nr, nc)] = (r, c)
                queue.append((nr, nc))
    return parents


def make_maze(size: int, rng: np.random.Generator, min_path: int = 0, max_tries: int = 50):
    """(input grid, label grid, path length) of one maze."""
    for _ in range(max_tries):
        grid = _carve(size, rng)
        open_cells = np.argwhere(grid == OPEN)
        row, col = open_cells[int(rng.integers(len(open_cells)))]
        seed_cell = (int(row), int(col))
        far = list(_bfs(grid, seed_cell))[-1]  # BFS order: the last cell is a farthest one
        parents = _bfs(grid, far)
        goal = list(parents)[-1]
        path = []
        node = parents[goal]
        while node is not None and node != far:
            path.append(node)
            node = parents[node]
        if len(path) + 2 < min_path:
            continue
        inputs = grid.copy()
        inputs[far], inputs[goal] = START, GOAL
        labels = inputs.copy()
        for cell in path:
            labels[cell] = PATH
        return inputs, labels, len(path) + 2
    raise ConfigError(f"no {size}x{size} maze with a path of {min_path} cells in {max_tries} tries; lower --min-path")


def dihedral(grid: np.ndarray, k: int) -> np.ndarray:
    """The k-th of the 8 dihedral transforms (rotations, then rotations of the transpose)."""
    return np.rot90(grid if k < 4 else grid.T, k % 4)


def generate_maze(spec: MazeSpec, output: str | None = None, progress=None) -> dict[str, Split]:
    """Generate train/test splits (and write them in upstream's format to ``output``)."""
    check_dataset_size((spec.train * (8 if spec.augment else 1)) + spec.test, spec.size * spec.size, output)
    if output:
        ensure_new_folder(output)
    splits = {}
    for split_id, (name, count) in enumerate((("train", spec.train), ("test", spec.test))):
        inputs, labels = [], []
        for index in range(count):
            rng = np.random.default_rng([spec.seed, split_id, index])
            x, y, _ = make_maze(spec.size, rng, spec.min_path)
            variants = range(8) if spec.augment and name == "train" else range(1)
            inputs.append([dihedral(x, k) for k in variants])
            labels.append([dihedral(y, k) for k in variants])
            if progress:
                progress(1)
        splits[name] = pack_groups(inputs, labels, seq_len=spec.size * spec.size, vocab_size=6)
    if output:
        save_dataset(output, splits, ["<blank>"])
    return splits
