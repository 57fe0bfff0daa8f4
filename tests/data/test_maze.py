import numpy as np
import pytest

from hrm_deploy.data.format import load_split
from hrm_deploy.data.maze import GOAL, OPEN, PATH, START, WALL, MazeSpec, _bfs, dihedral, generate_maze, make_maze
from hrm_deploy.errors import ConfigError


def test_maze_label_is_the_shortest_path():
    x, y, length = make_maze(15, np.random.default_rng(1))
    assert (x == START).sum() == 1 and (x == GOAL).sum() == 1 and set(np.unique(x)) <= {WALL, OPEN, START, GOAL}
    assert ((y != x) == (y == PATH)).all()  # the label only adds path cells
    start, goal = (tuple(np.argwhere(x == v)[0]) for v in (START, GOAL))
    parents = _bfs(x, start)
    steps, node = 0, goal
    while node != start:
        node, steps = parents[node], steps + 1
    assert steps + 1 == length == (y == PATH).sum() + 2  # path cells + S + G


def test_maze_dataset_upstream_format(tmp_path):
    generate_maze(MazeSpec(train=3, test=2, size=12, augment=True, seed=0), str(tmp_path / "m"))
    train, test = load_split(tmp_path / "m", "train"), load_split(tmp_path / "m", "test")
    meta = train.metadata
    assert (meta.seq_len, meta.vocab_size, meta.num_puzzle_identifiers) == (144, 6, 1)
    assert len(train) == 24 and len(test) == 2 and list(train.group_indices) == [0, 8, 16, 24]
    assert train.inputs.max() <= 4 and train.labels.max() == PATH and train.inputs.min() >= 1


def test_dihedral_covers_eight_distinct_transforms():
    g = np.arange(9).reshape(3, 3)
    assert len({dihedral(g, k).tobytes() for k in range(8)}) == 8


def test_maze_bad_spec():
    with pytest.raises(ConfigError):
        MazeSpec(size=3)
    with pytest.raises(ConfigError, match="min-path"):
        make_maze(7, np.random.default_rng(0), min_path=500, max_tries=2)
