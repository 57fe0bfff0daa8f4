import json

import numpy as np
import pytest

from hrm_deploy.data.format import check_fits_model, load_split, select_examples
from hrm_deploy.data.sudoku import SudokuSpec, count_solutions, generate_sudoku, shuffle_sudoku
from hrm_deploy.errors import ConfigError, DataError


def _valid(solution: np.ndarray) -> bool:
    s = solution.reshape(9, 9)
    groups = list(s) + list(s.T) + [s[r : r + 3, c : c + 3].flatten() for r in (0, 3, 6) for c in (0, 3, 6)]
    return all(sorted(g) == list(range(1, 10)) for g in groups)


def test_generated_dataset_is_upstream_format(tmp_path):
    root = tmp_path / "sudoku"
    generate_sudoku(SudokuSpec(train=6, test=4, blanks=(12, 20), augment=2, seed=1), str(root))
    meta = json.loads((root / "train" / "dataset.json").read_text())
    assert meta["seq_len"] == 81 and meta["vocab_size"] == 11 and meta["sets"] == ["all"]
    assert json.loads((root / "identifiers.json").read_text()) == ["<blank>"]
    train = load_split(root, "train")
    assert train.inputs.dtype == np.uint8 and train.puzzle_indices.dtype == np.int32
    assert len(train) == 18 and train.metadata.total_groups == 6 and list(train.group_indices[:3]) == [0, 3, 6]
    test = load_split(root, "test")
    for inp, lab in zip(test.inputs, test.labels):
        blanks = inp == 1
        assert 12 <= blanks.sum() <= 20
        assert np.all(inp[~blanks] == lab[~blanks]) and lab.min() >= 2  # labels: full solution, 2..10
        assert _valid(lab - 1)
        board = np.where(blanks, 0, inp - 1)
        assert count_solutions(board.tolist())[0] == 1


def test_augmentation_preserves_validity():
    rng = np.random.default_rng(0)
    from hrm_deploy.data.sudoku import random_solution

    sol = random_solution(rng)
    board = sol.copy()
    board[0, :4] = 0
    b2, s2 = shuffle_sudoku(board, sol, rng)
    assert _valid(s2) and (b2 == 0).sum() == 4


def test_same_seed_same_data():
    a = generate_sudoku(SudokuSpec(train=3, test=0, seed=5))["train"].inputs
    b = generate_sudoku(SudokuSpec(train=3, test=0, seed=5))["train"].inputs
    assert np.array_equal(a, b)


def test_bad_inputs(tmp_path, tiny_config):
    with pytest.raises(ConfigError):
        SudokuSpec(blanks=(30, 70))
    with pytest.raises(DataError, match="dataset.json"):
        load_split(tmp_path, "test")
    root = tmp_path / "d"
    generate_sudoku(SudokuSpec(train=2, test=2), str(root))
    with pytest.raises(DataError, match="not empty"):
        generate_sudoku(SudokuSpec(train=2, test=2), str(root))
    (root / "test" / "all__labels.npy").unlink()
    with pytest.raises(DataError, match="missing"):
        load_split(root, "test")
    with pytest.raises(DataError, match="vocab_size"):
        check_fits_model(load_split(root, "train").metadata, tiny_config.replace(vocab_size=12), "x")


def test_select_examples_is_deterministic():
    split = generate_sudoku(SudokuSpec(train=0, test=10, seed=2))["test"]
    a, b = select_examples(split, 4, seed=1), select_examples(split, 4, seed=1)
    assert np.array_equal(a, b) and len(a) == 4 and len(select_examples(split, 50)) == 10


def test_output_does_not_depend_on_worker_count():
    one = generate_sudoku(SudokuSpec(train=70, test=10, blanks=(5, 9), augment=1, seed=3, workers=1))
    two = generate_sudoku(SudokuSpec(train=70, test=10, blanks=(5, 9), augment=1, seed=3, workers=2))
    for split in ("train", "test"):
        assert (one[split].inputs == two[split].inputs).all() and (one[split].labels == two[split].labels).all()


def test_rating_by_solver_effort_bounds_the_search():
    hard = generate_sudoku(SudokuSpec(train=0, test=4, blanks=(50, 55), rating=(60, 0), seed=1, workers=1))["test"]
    for board in hard.inputs:
        grid = [int(v) - 1 if v > 1 else 0 for v in board]
        assert count_solutions(grid)[1] >= 60
    with pytest.raises(ConfigError, match="rating"):
        SudokuSpec(rating=(10, 5))


_FORKED_COLLECTION = r"""
import gc
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import hrm_deploy.system as system
from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])
graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 64])])
options = ort.SessionOptions()
options.intra_op_num_threads = 2
session = ort.InferenceSession(helper.make_model(graph).SerializeToString(), options, providers=["CPUExecutionProvider"])
session.run(None, {"x": np.ones((256, 64), np.float32)})  # its thread pool started
time.sleep(1.0)  # ... and its threads past spinning, asleep on their condition variable
holder = [session]
holder.append(holder)  # garbage that only the collector frees
del session, holder
gc.disable()  # ... and not this process's collector before the workers fork

original = system.die_with_parent


def collecting_worker():
    original()
    gc.collect()  # a worker's collector runs over what it inherited


system.die_with_parent = collecting_worker
splits = generate_sudoku(SudokuSpec(train=256, test=0, blanks=(3, 6), workers=2))
print(len(splits["train"].inputs))
"""


def test_forked_workers_never_collect_what_the_parent_held(tmp_path):
    """A session the parent holds only through a cycle, collected in a forked generator worker, hung
    it (its destructor waits for threads the child does not have): the parent's objects are frozen
    before the workers fork, so the workers finish."""
    import subprocess
    import sys

    script = tmp_path / "fork.py"
    script.write_text(_FORKED_COLLECTION)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "256"
