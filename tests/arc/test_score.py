"""The ARC scorer against straight ports of upstream's scorers, on hand-made predictions."""

from __future__ import annotations

import numpy as np
import pytest

from hrm_deploy.arc.score import TaskScore, Votes, labels_from_puzzles, labels_from_split, markdown, rank, score
from hrm_deploy.data import arc_grids as grids
from hrm_deploy.errors import DataError
from tests.arc import upstream_oracle as oracle

KS = (1, 2, 5, 10, 100, 1000)


def _augment(grid, tid, mapping):
    return grids.dihedral_transform(mapping[grid], tid)


def _predictions(trm_names: bool, seed: int = 0):
    """Tasks with 1-2 test inputs; per test input the original row and augmented rows (every
    transform) whose predictions are the (augmented) label, a wrong grid, a second wrong grid or
    garbage; q_halt logits equal within most tasks (ties on votes and mean q) and random in one;
    task 0 predicts one wrong grid everywhere (a single candidate)."""
    rng = np.random.default_rng(seed)
    names, row_ids, rows_in, rows_lab, rows_pred, qs, puzzles = ["<blank>"], [], [], [], [], [], {}
    tids = iter(list(range(8)) * 20)
    for t in range(6):
        task = f"{t:08x}"
        tests = []
        for _ in range(1 + t % 2):
            h, w = rng.integers(1, 6, size=2)
            tests.append(
                (rng.integers(0, 10, size=(h, w)).astype(np.uint8), rng.integers(0, 10, size=(w, h)).astype(np.uint8))
            )
        puzzles[task] = {"test": [{"input": x.tolist(), "output": y.tolist()} for x, y in tests]}
        plans = [(task, 0, np.arange(10, dtype=np.uint8))]
        for _ in range([1, 4, 5, 6, 3, 7][t]):
            tid = next(tids)
            mapping = np.concatenate([[0], rng.permutation(np.arange(1, 10))]).astype(np.uint8)
            digits = "".join(str(int(m)) for m in mapping)
            plans.append(
                (f"{task}|||t{tid}|||{digits}" if trm_names else grids.augment_name(task, tid, mapping), tid, mapping)
            )
        for v, (name, tid, mapping) in enumerate(plans):
            names.append(name)
            for i, (x, y) in enumerate(tests):
                choice = [0, 1, 0, 2, 1, 3, 0][(v + t + i) % 7] if t != 0 else 1
                pred = [y, (y + 1) % 10, y[:, :1].copy(), None][choice]
                row_ids.append(len(names) - 1)
                rows_in.append(grids.encode_grid(_augment(x, tid, mapping)))
                rows_lab.append(grids.encode_grid(_augment(y, tid, mapping)))
                if pred is None:
                    rows_pred.append(rng.integers(0, 12, size=900).astype(np.uint8))
                else:
                    rows_pred.append(grids.encode_grid(_augment(pred, tid, mapping)))
                qs.append(0.5 if t != 3 else rng.normal())
    ids = np.array(row_ids, dtype=np.int32)
    return names, puzzles, ids, np.stack(rows_in), np.stack(rows_lab), np.stack(rows_pred), np.array(qs)


def _blank_rows(ids, inputs, labels, preds, qs):
    """Padding rows (identifier 0) as upstream's batches carry them."""
    pad = np.zeros((2, inputs.shape[1]), np.uint8)
    return (
        np.concatenate([ids, [0, 0]]).astype(np.int32),
        np.concatenate([inputs, pad]),
        np.concatenate([labels, pad]),
        np.concatenate([preds, pad + 5]),
        np.concatenate([qs, [9.0, 9.0]]),
    )


def test_every_transform_inverts():
    rng = np.random.default_rng(1)
    grid = rng.integers(0, 10, size=(3, 5)).astype(np.uint8)
    for tid in range(8):
        mapping = np.concatenate([[0], rng.permutation(np.arange(1, 10))]).astype(np.uint8)
        augmented = _augment(grid, tid, mapping)
        for name in (grids.augment_name("abc", tid, mapping), f"abc|||t{tid}|||{''.join(map(str, mapping))}"):
            assert grids.parse_name(name)[:2] == ("abc", tid)
            np.testing.assert_array_equal(grids.inverse_augment(name, augmented), grid)
            if "|||" in name:
                np.testing.assert_array_equal(oracle.inverse_aug(name)[1](augmented), grid)
            else:
                np.testing.assert_array_equal(oracle.hrm_inverse_aug(name, augmented), grid)
    assert grids.parse_name("abc") == ("abc", 0, None)


def test_crop_matches_upstream():
    rng = np.random.default_rng(2)
    rows = [
        grids.encode_grid(rng.integers(0, 10, size=(h, w)), offset=(0, 0))
        for h, w in [(1, 1), (30, 30), (5, 30), (30, 2)]
    ]
    rows += [rng.integers(0, 12, size=900).astype(np.uint8) for _ in range(40)]
    rows += [np.full(900, 7, np.uint8), np.zeros(900, np.uint8)]
    rows += [np.where(rng.random(900) < 0.02, 1, rng.integers(2, 12, size=900)).astype(np.uint8) for _ in range(20)]
    for row, got in zip(rows, grids.crop_batch(np.stack(rows))):
        want = oracle._crop(row)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pass_at_k_and_submission_match_trm(seed):
    names, puzzles, ids, inputs, labels, preds, qs = _predictions(trm_names=True, seed=seed)
    ids, inputs, labels, preds, qs = _blank_rows(ids, inputs, labels, preds, qs)
    want, want_submission = oracle.trm_result(names, puzzles, ids, inputs, preds, qs, KS)
    votes = Votes()
    votes.add(names, ids[:7], inputs[:7], preds[:7], qs[:7])  # in two batches, as an evaluation streams them
    votes.add(names, ids[7:], inputs[7:], preds[7:], qs[7:])
    got = score(labels_from_puzzles(puzzles), votes, KS, TaskScore.FRACTION)
    assert got.pass_at == pytest.approx(want)
    assert got.submission == want_submission
    assert 0 < got.pass_at[1] < got.pass_at[1000] <= 1  # the fixture is not trivially all-right or all-wrong


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pass_at_k_matches_hrm_notebook(seed):
    names, _, ids, inputs, labels, preds, qs = _predictions(trm_names=False, seed=seed)
    want = oracle.hrm_test(names, ids, inputs, labels, preds, qs, list(KS))
    votes = Votes()
    votes.add(names, ids, inputs, preds, qs)
    got = score(labels_from_split(names, ids, inputs, labels), votes, KS, TaskScore.ALL)
    assert got.pass_at == pytest.approx(want)


def test_ties_keep_first_appearance_and_single_candidate_repeats():
    # two candidates, one vote each, same q: upstream's stable reversed sort keeps "a" first
    assert [h for h, _, _ in rank([("a", 0.5), ("b", 0.5)])] == ["a", "b"]
    # more votes beat a higher q; equal votes: higher mean q first
    assert [h for h, _, _ in rank([("a", 0.9), ("b", 0.1), ("b", 0.1)])] == ["b", "a"]
    assert [h for h, _, _ in rank([("a", 0.2), ("b", 0.3), ("a", 0.2), ("b", 0.3)])] == ["b", "a"]
    names, puzzles, ids, inputs, labels, preds, qs = _predictions(trm_names=True)
    votes = Votes()
    votes.add(names, ids, inputs, preds, qs)
    result = score(labels_from_puzzles(puzzles), votes, KS)
    single = result.submission["00000000"][0]  # task 0 predicts one (wrong) grid everywhere
    assert single["attempt_1"] == single["attempt_2"]
    assert result.tasks["00000000"]["tests"][0]["candidates"] == 1


def test_submission_format_and_report():
    names, puzzles, ids, inputs, labels, preds, qs = _predictions(trm_names=True)
    votes = Votes()
    votes.add(names, ids, inputs, preds, qs)
    result = score(labels_from_puzzles(puzzles), votes, (2, 1))
    assert list(result.pass_at) == [1, 2]
    for task, attempts in result.submission.items():
        assert len(attempts) == len(puzzles[task]["test"])
        for entry in attempts:
            assert set(entry) == {"attempt_1", "attempt_2"}
            for grid in entry.values():
                assert all(isinstance(v, int) and 0 <= v <= 9 for row in grid for v in row)
                assert len({len(row) for row in grid}) == 1
    text = markdown(result.to_json())
    assert "pass@2" in text and "00000005" in text


def test_bad_inputs_are_one_clear_error():
    names, puzzles, ids, inputs, labels, preds, qs = _predictions(trm_names=True)
    with pytest.raises(DataError, match="outside identifiers.json"):
        Votes().add(names[:3], ids, inputs, preds, qs)
    with pytest.raises(DataError, match="outside identifiers.json"):
        labels_from_split(names[:3], ids, inputs, labels)
    with pytest.raises(DataError, match="positive"):
        score(labels_from_puzzles(puzzles), Votes(), (0,))
    with pytest.raises(DataError, match="no test puzzles"):
        score({}, Votes())
