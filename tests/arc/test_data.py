"""``data arc``: upstream-format ARC datasets from self-made task files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hrm_deploy.arc.score import labels_from_split
from hrm_deploy.data import arc_grids as grids
from hrm_deploy.data.arc import ArcSpec, build_arc
from hrm_deploy.data.format import load_split
from hrm_deploy.errors import DataError


def make_tasks(root: Path, n_train: int = 2, n_eval: int = 2, seed: int = 0) -> Path:
    """ARC-AGI layout: training/ and evaluation/ folders of tiny tasks (output = input flipped)."""
    rng = np.random.default_rng(seed)
    for subset, count in (("training", n_train), ("evaluation", n_eval)):
        folder = root / subset
        folder.mkdir(parents=True)
        for t in range(count):

            def pair(h: int, w: int) -> dict:
                x = rng.integers(0, 10, size=(h, w))
                return {"input": x.tolist(), "output": np.fliplr(x).tolist()}

            task = {"train": [pair(2, 3), pair(3, 2)], "test": [pair(1 + t % 3, 2)] + ([pair(2, 2)] if t == 1 else [])}
            (folder / f"{subset[:2]}{t:06x}.json").write_text(json.dumps(task))
    return root


def test_builds_upstream_format(tmp_path):
    source = make_tasks(tmp_path / "src")
    out = tmp_path / "arc"
    splits, identifiers = build_arc(ArcSpec(str(source), num_aug=3, max_grid=6), out)
    test = load_split(out, "test")
    train = load_split(out, "train")
    assert json.loads((out / "identifiers.json").read_text()) == identifiers
    assert identifiers[0] == "<blank>" and len(identifiers) == 1 + 4 * 4  # <blank>, 4 tasks x (original + 3 copies)
    assert test.metadata.seq_len == 36 and test.metadata.vocab_size == 12
    assert test.metadata.num_puzzle_identifiers == len(identifiers)
    # the test split: evaluation tasks' test pairs only (2 tasks, 1 + 2 test pairs, 4 copies each)
    assert len(test) == 4 * 3 and test.metadata.total_groups == 2
    # the train split: training tasks with their test pairs, evaluation tasks' train pairs
    assert len(train) == 4 * ((2 + 1) + (2 + 2) + 2 + 2) and train.metadata.total_groups == 4
    names = [identifiers[i] for i in test.puzzle_identifiers]
    for name in names:
        task, tid, mapping = grids.parse_name(name)
        assert task.startswith("ev") and (mapping is None) == (name == task)
    # every augmented test row inverts to its task's original pair
    labels = labels_from_split(identifiers, test.example_puzzle_ids(), test.inputs, test.labels)
    assert sorted(labels) == ["ev000000", "ev000001"] and len(labels["ev000001"]) == 2
    for row, ident in enumerate(test.example_puzzle_ids()):
        name = identifiers[ident]
        x, y = grids.crop_batch(np.stack([test.inputs[row], test.labels[row]]))
        task = json.loads((source / "evaluation" / f"{grids.parse_name(name)[0]}.json").read_text())
        originals = [(np.array(p["input"]), np.array(p["output"])) for p in task["test"]]
        xi, yi = grids.inverse_augment(name, x), grids.inverse_augment(name, y)
        assert any(np.array_equal(xi, a) and np.array_equal(yi, b) for a, b in originals)
    # same seed and files: same dataset
    again, _ = build_arc(ArcSpec(str(source), num_aug=3, max_grid=6))
    np.testing.assert_array_equal(again["train"].inputs, splits["train"].inputs)


def test_flat_folder_is_the_test_set(tmp_path):
    source = make_tasks(tmp_path / "src")
    splits, identifiers = build_arc(ArcSpec(str(source / "training"), num_aug=0, max_grid=6))
    assert len(splits["test"]) == 3 and sorted(identifiers) == ["<blank>", "tr000000", "tr000001"]


def test_bad_sources_are_clear(tmp_path):
    with pytest.raises(DataError, match="not a folder"):
        build_arc(ArcSpec(str(tmp_path / "missing")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no ARC task files"):
        build_arc(ArcSpec(str(tmp_path / "empty")))
    source = make_tasks(tmp_path / "src")
    with pytest.raises(DataError, match="exceeds the 2x2"):
        build_arc(ArcSpec(str(source), num_aug=0, max_grid=2))
    with pytest.raises(DataError, match="no test puzzles"):
        build_arc(ArcSpec(str(source), num_aug=0, max_grid=6, test_subsets=("nothing",)))
    ok = {"input": [[1]], "output": [[1]]}
    bad = source / "evaluation" / "bad.json"
    for task, message in (
        ({"train": [ok], "test": [{"input": [[1]]}]}, "bad.json test\\[0\\]: needs both"),
        ({"train": [ok], "test": []}, "bad.json: its 'test' list is empty"),
        ({"train": [], "test": [ok]}, "bad.json: its 'train' list is empty"),
        ({"train": [{"input": [[1, 2], [3]], "output": [[1]]}], "test": [ok]}, "train\\[0\\] input: not a grid"),
        ({"train": [{"input": [[10]], "output": [[1]]}], "test": [ok]}, "colours must be 0..9"),
        ({"train": [ok], "test": [{"input": [[1] * 31] * 31, "output": [[1]]}]}, "grid 31x31 exceeds the 30x30"),
    ):
        bad.write_text(json.dumps(task))
        with pytest.raises(DataError, match=message):
            build_arc(ArcSpec(str(source), num_aug=0, max_grid=30 if "31x31" in message else 6))


def test_cli(tmp_path):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    source = make_tasks(tmp_path / "src")
    result = CliRunner().invoke(
        app,
        ["data", "arc", "--source", str(source), "-o", str(tmp_path / "d"), "--num-aug", "2", "--max-grid", "6", "-q"],
    )
    assert result.exit_code == 0, result.output
    assert "puzzle identifiers" in result.output
    result = CliRunner().invoke(app, ["data", "arc", "--source", str(source), "-o", str(tmp_path / "d"), "-q"])
    assert result.exit_code != 0 and "not empty" in result.output
