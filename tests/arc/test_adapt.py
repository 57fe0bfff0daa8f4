"""``adapt``: new ARC tasks' rows appended to a checkpoint's table and trained on their demonstrations
only; the base and the task files untouched; resume; bad input one line each."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from hrm_deploy.arc.adapt import AdaptConfig, adapt, read_record
from hrm_deploy.data.format import load_split
from hrm_deploy.errors import ConfigError, DataError
from hrm_deploy.io import sha256_file
from tests.arc.conftest import SIDE
from tests.arc.test_data import make_tasks


def new_tasks(root: Path, count: int = 2, seed: int = 7) -> Path:
    """A flat folder of ``count`` tasks named new0.. that no base has (output = input flipped)."""
    made = make_tasks(root / "made", n_train=0, n_eval=count, seed=seed)
    folder = root / "tasks"
    folder.mkdir()
    for i, task in enumerate(sorted((made / "evaluation").glob("*.json"))):
        shutil.copy(task, folder / f"new{i}.json")
    shutil.rmtree(made)
    return folder


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _config(checkpoint, tasks, out, **kw) -> AdaptConfig:
    settings = dict(steps=4, num_aug=3, batch_size=4, puzzle_emb_lr=0.05, checkpoint_minutes=0, device="cpu")
    return AdaptConfig(checkpoint=str(checkpoint), tasks=(str(tasks),), out=str(out), **{**settings, **kw})


def _state(path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["model_state"]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["hrm", "trm"])
def test_adapt_trains_only_the_new_rows(request, family):
    checkpoint, data, tmp = request.getfixturevalue("arc_run" if family == "hrm" else "trm_run")
    tasks = new_tasks(tmp / "new")
    base_sha, tasks_before = sha256_file(checkpoint), _snapshot(tasks)
    base_names = json.loads((data / "identifiers.json").read_text())
    base = _state(checkpoint)
    rows = base["puzzle_emb.weights"].shape[0]

    result = adapt(_config(checkpoint, tasks, tmp / "out", base_data=str(data)), progress=False)

    assert not result.interrupted and result.steps_done == 4
    assert sha256_file(checkpoint) == base_sha and _snapshot(tasks) == tasks_before  # inputs untouched
    adapted = _state(result.checkpoint)
    assert adapted.keys() == base.keys()
    for key, value in base.items():  # every base weight bit-identical, the table's base rows too
        if key != "puzzle_emb.weights":
            assert torch.equal(adapted[key], value), key
    table = adapted["puzzle_emb.weights"]
    assert torch.equal(table[:rows], base["puzzle_emb.weights"])
    new = table[rows:]
    assert new.shape[0] == 2 * 4  # 2 tasks x (original + 3 copies)
    assert int((new != 0).any(dim=1).sum()) >= 4  # the rows the batches looked up moved off their zero init

    record = read_record(tmp / "out")
    assert record["base"]["sha256"] == base_sha and record["base"]["identifiers_known"]
    assert record["new_rows"] == {"first": rows, "count": 8} and record["train"] == "embeddings"
    assert record["tasks"] == {p.stem: sha256_file(p) for p in sorted(tasks.glob("*.json"))}
    assert record["status"] == "done" and record["checkpoint_sha256"] == sha256_file(result.checkpoint)

    identifiers = json.loads((result.data / "identifiers.json").read_text())
    assert identifiers[:rows] == base_names and len(identifiers) == rows + 8
    train, test = load_split(result.data, "train"), load_split(result.data, "test")
    assert train.example_puzzle_ids().min() >= rows and test.example_puzzle_ids().min() >= rows
    assert test.metadata.num_puzzle_identifiers == rows + 8
    # the train split holds the demonstrations only: 2 per copy, never a test pair
    assert len(train) == 8 * 2 and train.metadata.total_groups == 8
    test_labels = {bytes(row) for row in np.asarray(test.labels)}
    assert not test_labels & {bytes(row) for row in np.asarray(train.labels)}
    assert len(test) == 4 * (1 + 2)  # new0 has one test input, new1 two (make_tasks)


@pytest.mark.slow
def test_train_all_changes_the_weights(arc_run):
    checkpoint, data, tmp = arc_run
    result = adapt(_config(checkpoint, new_tasks(tmp / "new"), tmp / "out", train="all", lr=1e-2), progress=False)
    base, adapted = _state(checkpoint), _state(result.checkpoint)
    assert any(not torch.equal(adapted[k], v) for k, v in base.items() if k != "puzzle_emb.weights")


@pytest.mark.slow
def test_resume_continues_where_it_stopped(arc_run):
    checkpoint, _, tmp = arc_run
    tasks = new_tasks(tmp / "new")
    straight = adapt(_config(checkpoint, tasks, tmp / "straight"), progress=False)
    first = adapt(_config(checkpoint, tasks, tmp / "split"), progress=False, stop_after=2)
    assert first.steps_done == 2 and read_record(tmp / "split")["status"] == "stopped early"
    with pytest.raises(ConfigError, match="already exists and is not empty; continue .* --resume"):
        adapt(_config(checkpoint, tasks, tmp / "split"), progress=False)
    second = adapt(_config(checkpoint, tasks, tmp / "split"), resume=True, progress=False)
    assert second.steps_done == 4 and read_record(tmp / "split")["status"] == "done"
    steps = [json.loads(line).get("step") for line in (tmp / "split" / "metrics.jsonl").read_text().splitlines()]
    assert steps[:4] == [1, 2, 3, 4]
    # one process, same seed: the resumed run ends where the straight one did, bit for bit
    assert torch.equal(
        _state(second.checkpoint)["puzzle_emb.weights"], _state(straight.checkpoint)["puzzle_emb.weights"]
    )
    other = new_tasks(tmp / "other", seed=9)
    with pytest.raises(ConfigError, match="another base checkpoint or other tasks"):
        adapt(_config(checkpoint, other, tmp / "split"), resume=True, progress=False)


def test_bad_budgets_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="--steps 0: the budget must be at least 1 step"):
        _config("ckpt", tmp_path, tmp_path / "out", steps=0)
    for minutes in (0, -1.5):
        with pytest.raises(ConfigError, match="the budget must be more than 0 minutes"):
            _config("ckpt", tmp_path, tmp_path / "out", minutes=minutes)
    with pytest.raises(ConfigError, match="--train some"):
        _config("ckpt", tmp_path, tmp_path / "out", train="some")


def test_bad_inputs_are_one_line_and_write_nothing(arc_run):
    checkpoint, data, tmp = arc_run
    tasks = new_tasks(tmp / "new")
    before = _snapshot(tmp)
    cases = [
        (dict(out=tmp), ConfigError, "is in the base checkpoint's folder"),
        (dict(out=tasks / "out"), ConfigError, "is in an input task folder"),
        (
            dict(tasks=data.parent / "src" / "evaluation", base_data=str(data)),
            ConfigError,
            "already has puzzle-embedding rows",
        ),
        (dict(base_data=str(tmp / "src")), DataError, "holds no identifiers.json"),
        (dict(resume=True), ConfigError, "holds no adapt run"),
    ]
    for changes, error, message in cases:
        changes = dict(changes)
        resume = changes.pop("resume", False)
        config = _config(
            checkpoint, changes.pop("tasks", tasks), changes.pop("out", tmp.parent / "adapt-out"), **changes
        )
        with pytest.raises(error, match=message) as caught:
            adapt(config, resume=resume, progress=False)
        assert "\n" not in str(caught.value)
    assert _snapshot(tmp) == before and not (tmp.parent / "adapt-out").exists()
    # the faults `data arc` refuses, one line each
    bad = tmp.parent / "bad-tasks"
    bad.mkdir()
    (bad / "colour.json").write_text(
        json.dumps({"train": [{"input": [[10]], "output": [[1]]}], "test": [{"input": [[1]], "output": [[1]]}]})
    )
    with pytest.raises(DataError, match=r"colour.json train\[0\] input: colours must be 0\.\.9"):
        adapt(_config(checkpoint, bad, tmp.parent / "adapt-out"), progress=False)
    (bad / "colour.json").write_text(json.dumps({"train": [], "test": [{"input": [[1]], "output": [[1]]}]}))
    with pytest.raises(DataError, match="'train' list is empty"):
        adapt(_config(checkpoint, bad, tmp.parent / "adapt-out"), progress=False)
    (bad / "colour.json").write_text(
        json.dumps(
            {"train": [{"input": [[1] * (SIDE + 1)], "output": [[1]]}], "test": [{"input": [[1]], "output": [[1]]}]}
        )
    )
    with pytest.raises(DataError, match=f"exceeds the {SIDE}x{SIDE} maximum"):
        adapt(_config(checkpoint, bad, tmp.parent / "adapt-out"), progress=False)


@pytest.mark.slow
def test_replace_adapts_a_known_task(arc_run):
    checkpoint, data, tmp = arc_run
    known = data.parent / "src" / "evaluation"
    result = adapt(_config(checkpoint, known, tmp / "out", base_data=str(data), replace=True, steps=1), progress=False)
    rows = json.loads((data / "identifiers.json").read_text())
    identifiers = json.loads((result.data / "identifiers.json").read_text())
    assert identifiers[: len(rows)] == rows and "ev000000" in identifiers[len(rows) :]


def test_a_test_input_without_output_is_answered_not_scored(tmp_path):
    """A new task as a competition gives it (test inputs only): its rows are built, their labels are
    all ignore tokens, and TRM's test_puzzles.json carries no label for it (arc-eval: not passed)."""
    from hrm_deploy.arc.adapt_data import build_new_tasks, task_refs
    from hrm_deploy.arc.score import labels_from_puzzles

    tasks = new_tasks(tmp_path)
    task = json.loads((tasks / "new1.json").read_text())
    del task["test"][1]["output"]
    (tasks / "new1.json").write_text(json.dumps(task))
    built = build_new_tasks(task_refs([tasks]), 17, None, SIDE, 3, 0)
    test = built.splits["test"]
    unlabelled = ~np.asarray(test.labels).any(axis=1)
    assert int(unlabelled.sum()) == 4  # new1's second test input, in all 4 copies
    assert built.test_puzzles is not None
    labels = labels_from_puzzles(built.test_puzzles)
    assert [t.label is None for t in labels["new1"]] == [False, True]
    assert built.identifiers[:17] == ["<blank>"] + [f"<base {i}>" for i in range(1, 17)]
    # train pairs still need their outputs: one line
    del task["train"][0]["output"]
    (tasks / "new1.json").write_text(json.dumps(task))
    with pytest.raises(DataError, match=r"new1.json train\[0\]: needs both 'input' and 'output'"):
        build_new_tasks(task_refs([tasks]), 17, None, SIDE, 3, 0)


@pytest.mark.slow
def test_a_minutes_budget_stops_the_run(arc_run):
    checkpoint, _, tmp = arc_run
    result = adapt(_config(checkpoint, new_tasks(tmp / "new"), tmp / "out", steps=10**6, minutes=1e-4), progress=False)
    record = read_record(tmp / "out")
    assert not result.interrupted and result.steps_done < 10**6
    assert record["status"] == "time budget" and record["budget"] == {"steps": 10**6, "minutes": 1e-4}
    assert (tmp / "out" / "last.pt").is_file()


def test_the_recorded_dataset_names_the_base_rows(arc_run):
    """A trainer checkpoint records its dataset: its identifiers.json is found without --base-data,
    and a task it already has rows for is refused (one line) before anything is written."""
    from hrm_deploy.model.checkpoint import load_checkpoint, save_checkpoint

    checkpoint, data, tmp = arc_run
    model, _ = load_checkpoint(checkpoint)
    recorded = save_checkpoint(tmp / "run" / "last.pt", model, train_config={"data_path": str(data)})
    known = data.parent / "src" / "evaluation"
    with pytest.raises(
        ConfigError, match=r"task ev000000 already has puzzle-embedding rows .*\(and 1 more\); pass --replace"
    ):
        adapt(_config(recorded, known, tmp / "out"), progress=False)
    assert not (tmp / "out").exists()


def test_adapt_never_writes_inside_the_dataset_the_base_was_trained_on(arc_run):
    """-o inside the base's dataset (as its checkpoint records it, or --base-data) is refused before
    any work, as the base's run folder and the task folders are."""
    from hrm_deploy.model.checkpoint import load_checkpoint, save_checkpoint

    checkpoint, data, tmp = arc_run
    tasks = new_tasks(tmp / "new")
    with pytest.raises(ConfigError, match="is inside .*the dataset the base checkpoint was trained on"):
        adapt(_config(checkpoint, tasks, data / "ad", base_data=str(data)), progress=False)
    model, _ = load_checkpoint(checkpoint)  # a trainer's checkpoint records its data_path
    recorded = save_checkpoint(tmp / "trained.pt", model, train_config={"data_path": str(data)})
    with pytest.raises(ConfigError, match="is inside .*the dataset the base checkpoint was trained on"):
        adapt(_config(recorded, tasks, data / "sub" / "ad"), progress=False)
    assert not (data / "ad").exists() and not (data / "sub").exists()
