# ruff: noqa: B007  (a straight port: upstream's loop variables kept as written)
"""Straight ports of upstream's ARC scorers, kept as test oracles (numba and torch removed).

``trm_result``: TinyRecursiveModels ``evaluators/arc.py`` (``ARC.update_batch`` + ``ARC.result``)
with ``dataset/build_arc_dataset.py``'s ``inverse_aug`` / ``grid_hash``; ``hrm_test``: HRM's
``arc_eval.ipynb`` ``test()``."""

from __future__ import annotations

import hashlib

import numpy as np

DIHEDRAL_INVERSE = [0, 3, 2, 1, 4, 5, 6, 7]
PuzzleIdSeparator = "|||"


def dihedral_transform(arr, tid):
    if tid == 0:
        return arr
    elif tid == 1:
        return np.rot90(arr, k=1)
    elif tid == 2:
        return np.rot90(arr, k=2)
    elif tid == 3:
        return np.rot90(arr, k=3)
    elif tid == 4:
        return np.fliplr(arr)
    elif tid == 5:
        return np.flipud(arr)
    elif tid == 6:
        return arr.T
    elif tid == 7:
        return np.fliplr(np.rot90(arr, k=1))
    else:
        return arr


def inverse_dihedral_transform(arr, tid):
    return dihedral_transform(arr, DIHEDRAL_INVERSE[tid])


def _crop(grid):
    grid = grid.reshape(30, 30)
    max_area = 0
    max_size = (0, 0)
    nr, nc = grid.shape
    num_c = nc
    for num_r in range(1, nr + 1):
        for c in range(1, num_c + 1):
            x = grid[num_r - 1, c - 1]
            if (x < 2) | (x > 11):
                num_c = c - 1
                break
        area = num_r * num_c
        if area > max_area:
            max_area = area
            max_size = (num_r, num_c)
    return (grid[: max_size[0], : max_size[1]] - 2).astype(np.uint8)


def grid_hash(grid):
    assert grid.ndim == 2
    assert grid.dtype == np.uint8
    buffer = [x.to_bytes(1, byteorder="big") for x in grid.shape]
    buffer.append(grid.tobytes())
    return hashlib.sha256(b"".join(buffer)).hexdigest()


def arc_grid_to_np(grid):
    arr = np.array(grid)
    assert arr.ndim == 2
    assert arr.shape[0] <= 30 and arr.shape[1] <= 30
    assert np.all((arr >= 0) & (arr <= 9))
    return arr.astype(np.uint8)


def inverse_aug(name):
    if PuzzleIdSeparator not in name:
        return name, lambda x: x
    trans_id, perm = name.split(PuzzleIdSeparator)[-2:]
    trans_id = int(trans_id[1:])
    inv_perm = np.argsort(list(perm)).astype(np.uint8)

    def _map_grid(grid):
        return inv_perm[inverse_dihedral_transform(grid, trans_id)]

    return name.split(PuzzleIdSeparator)[0], _map_grid


def trm_result(identifier_map, test_puzzles, puzzle_identifiers, inputs, preds, q_halt_logits, pass_Ks, submission_K=2):
    _local_hmap, _local_preds = {}, {}
    q_values = 1 / (1 + np.exp(-q_halt_logits.astype(np.float64)))
    mask = puzzle_identifiers != 0
    for identifier, input, pred, q in zip(puzzle_identifiers[mask], inputs[mask], preds[mask], q_values[mask]):
        name = identifier_map[identifier]
        orig_name, _inverse_fn = inverse_aug(name)
        input_hash = grid_hash(_inverse_fn(_crop(input)))
        pred = _inverse_fn(_crop(pred))
        pred_hash = grid_hash(pred)
        _local_hmap[pred_hash] = pred
        _local_preds.setdefault(orig_name, {})
        _local_preds[orig_name].setdefault(input_hash, [])
        _local_preds[orig_name][input_hash].append((pred_hash, float(q)))
    global_hmap_preds = [(_local_hmap, _local_preds)]

    submission = {}
    correct = [0.0 for _ in range(len(pass_Ks))]
    for name, puzzle in test_puzzles.items():
        submission[name] = []
        num_test_correct = [0 for _ in range(len(pass_Ks))]
        for pair in puzzle["test"]:
            input_hash = grid_hash(arc_grid_to_np(pair["input"]))
            label_hash = grid_hash(arc_grid_to_np(pair["output"]))
            p_map = {}
            for hmap, preds_ in global_hmap_preds:
                for h, q in preds_.get(name, {}).get(input_hash, {}):
                    p_map.setdefault(h, [0, 0])
                    p_map[h][0] += 1
                    p_map[h][1] += q
            if not len(p_map):
                continue
            for h, stats in p_map.items():
                stats[1] /= stats[0]
            p_map = sorted(p_map.items(), key=lambda kv: kv[1], reverse=True)
            for i, k in enumerate(pass_Ks):
                ok = False
                for h, stats in p_map[:k]:
                    ok |= h == label_hash
                num_test_correct[i] += ok
            pred_grids = []
            for h, stats in p_map[:submission_K]:
                for hmap, preds_ in global_hmap_preds:
                    if h in hmap:
                        pred_grids.append(hmap[h])
                        break
            while len(pred_grids) < submission_K:
                pred_grids.append(pred_grids[0])
            submission[name].append({f"attempt_{i + 1}": grid.tolist() for i, grid in enumerate(pred_grids)})
        for i in range(len(pass_Ks)):
            correct[i] += num_test_correct[i] / len(puzzle["test"])
    return {k: correct[i] / len(test_puzzles) for i, k in enumerate(pass_Ks)}, submission


def hrm_inverse_aug(name, grid):
    if "_" not in name:
        return grid
    trans_id, perm = name.split("_")[-2:]
    trans_id = int(trans_id[1:])
    inv_perm = np.argsort(list(perm))
    return inv_perm[inverse_dihedral_transform(grid, trans_id)]


def hrm_grid_hash(grid):
    return hash((grid.tobytes(), grid.shape))


def hrm_test(identifier_map, puzzle_identifiers, inputs, labels, preds, q_halt_logits, Ks):
    puzzle_labels = {}
    for identifier, input, label in zip(puzzle_identifiers, inputs, labels):
        name = identifier_map[identifier]
        if "_" not in name:
            puzzle_labels.setdefault(name, {})
            input = _crop(input)
            label = _crop(label)
            input_hash = hrm_grid_hash(input)
            label_hash = hrm_grid_hash(label)
            assert input_hash not in puzzle_labels[name]
            puzzle_labels[name][input_hash] = label_hash
    pred_answers = {}
    q_sig = 1 / (1 + np.exp(-q_halt_logits.astype(np.float64)))
    for identifier, input, pred, q in zip(puzzle_identifiers, inputs, preds, q_sig):
        name = identifier_map[identifier]
        orig_name = name.split("_")[0]
        input_hash = hrm_grid_hash(hrm_inverse_aug(name, _crop(input)).astype(np.uint8))
        assert input_hash in puzzle_labels[orig_name]
        pred = hrm_inverse_aug(name, _crop(pred)).astype(np.uint8)
        pred_hash = hrm_grid_hash(pred)
        pred_answers.setdefault(orig_name, {})
        pred_answers[orig_name].setdefault(input_hash, [])
        pred_answers[orig_name][input_hash].append((pred_hash, float(q)))
    correct = [0 for _ in range(len(Ks))]
    for name, tests in puzzle_labels.items():
        num_test_correct = [0 for _ in range(len(Ks))]
        for input_hash, label_hash in tests.items():
            p = pred_answers[name][input_hash]
            p_map = {}
            for h, q in p:
                p_map.setdefault(h, [0, 0])
                p_map[h][0] += 1
                p_map[h][1] += q
            for h, stats in p_map.items():
                stats[1] /= stats[0]
            p_map = sorted(p_map.items(), key=lambda kv: kv[1], reverse=True)
            for i, k in enumerate(Ks):
                ok = False
                for h, stats in p_map[:k]:
                    ok |= h == label_hash
                num_test_correct[i] += ok
        for i in range(len(Ks)):
            correct[i] += num_test_correct[i] == len(tests)
    return {k: correct[i] / len(puzzle_labels) for i, k in enumerate(Ks)}
