"""The dataset ``adapt`` trains on: new ARC tasks, augmented as ``data arc`` augments them, with puzzle
identifiers that continue a checkpoint's table.

The rules are :mod:`hrm_deploy.data.arc`'s (the same augmentation draws, names and canvas encoding);
what differs is the layout, because only the new tasks' demonstrations may be learned from:

- the train split holds every copy's ``train`` pairs (never a test output), shifted in the canvas
  as upstream shifts train pairs, one puzzle group per copy, so a batch can hold many copies
  even when there are few tasks;
- the test split holds every copy's ``test`` pairs, grouped by task, as ``data arc`` writes an
  evaluation subset: ``arc-eval`` scores it;
- identifier ``base_rows + i`` names the i-th new copy; ``identifiers.json`` lists the base's
  names first (or ``<base N>`` placeholders when they are unknown), so every identifier indexes
  the adapted table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.data.arc import TaskRef, augment_task, find_subsets, load_task, pack_arc_groups
from hrm_deploy.data.arc_grids import parse_name
from hrm_deploy.data.format import Split
from hrm_deploy.errors import ConfigError, DataError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewTasks:
    """The built dataset: splits, the full identifier list (base first) and each task's file sha256."""

    splits: dict[str, Split]
    identifiers: list[str]
    task_sha256: dict[str, str]
    base_rows: int
    # TRM's test_puzzles.json ({task: {"test": [pairs]}}) when a test pair has no output: arc-eval
    # then scores such a test input as not passed (and still answers it in submission.json)
    test_puzzles: dict[str, Any] | None = None

    @property
    def new_rows(self) -> int:
        return len(self.identifiers) - self.base_rows


def task_refs(paths: list[Path]) -> list[TaskRef]:
    """The ARC tasks of ``paths`` (task JSON files, or folders as ``data arc --source`` takes them),
    sorted by name; a name given twice is one error line."""
    refs: list[TaskRef] = []
    for path in paths:
        if path.is_file():
            if path.suffix != ".json":
                raise DataError(f"--tasks {path}: not an ARC task file (<task>.json) nor a folder of them")
            refs.append(TaskRef(path.stem, str(path), path))
        elif path.is_dir():
            refs += [ref for _, tasks in find_subsets(path) for ref in tasks]
        else:
            raise DataError(f"--tasks {path} does not exist; give ARC task JSON files or a folder of them")
    names = [ref.name for ref in refs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DataError(f"--tasks: task {twice[0]} is given twice (task names are file names); give each task once")
    return sorted(refs, key=lambda ref: ref.name)


def task_sha256(ref: TaskRef) -> str:
    """The sha256 of a task file's bytes (of its canonical JSON for a bundled task)."""
    data = ref.path.read_bytes() if ref.path is not None else json.dumps(ref.data, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def _open_test_outputs(ref: TaskRef) -> tuple[TaskRef, list[bool]]:
    """``ref`` with a placeholder output for each test pair that has none (a task to answer, not to
    score), and which test pairs had none; every other fault is left for ``load_task`` to name."""
    data = ref.read()
    if not isinstance(data, dict) or not isinstance(data.get("test"), list):
        return ref, []
    missing = [isinstance(pair, dict) and "input" in pair and "output" not in pair for pair in data["test"]]
    if not any(missing):
        return ref, missing
    tests = [{**pair, "output": [[0]]} if lacks else pair for pair, lacks in zip(data["test"], missing)]
    return TaskRef(ref.name, ref.where, data={**data, "test": tests}), missing


def check_new_names(names: list[str], base_identifiers: list[str] | None, replace: bool) -> None:
    """Refuse a task the base already has rows for (by task name, any augmentation) unless ``replace``."""
    if base_identifiers is None or replace:
        return
    known = {parse_name(name)[0] for name in base_identifiers}
    clash = [name for name in names if name in known]
    if clash:
        raise ConfigError(
            f"task {clash[0]} already has puzzle-embedding rows in the base checkpoint"
            + (f" (and {len(clash) - 1} more)" if len(clash) > 1 else "")
            + "; pass --replace to adapt new rows for it anyway (the base's rows stay as they are)"
        )


def build_new_tasks(
    refs: list[TaskRef], base_rows: int, base_identifiers: list[str] | None, side: int, num_aug: int, seed: int
) -> NewTasks:
    """Augment ``refs`` (``num_aug`` copies each, ``seed``) into a ``side`` x ``side`` canvas, with
    identifiers ``base_rows`` onwards (see the module's docstring)."""
    if num_aug < 0:
        raise DataError(f"--num-aug {num_aug}: use 0 or more (upstream: 1000)")
    rng = np.random.RandomState(seed)
    train_groups, test_groups, unlabelled, open_inputs = [], [], [], 0
    for ref in refs:
        opened, missing = _open_test_outputs(ref)
        group = augment_task(ref.name, load_task(opened, side), num_aug, rng)
        train_groups += [[(name, task["train"])] for name, task in group]  # one group per copy
        test_groups.append([(name, task["test"]) for name, task in group])
        unlabelled += missing * len(group)  # the test split's rows: copy by copy, pair by pair
        open_inputs += sum(missing)
    names = [name for group in train_groups for name, _ in group]
    ids = {name: base_rows + i for i, name in enumerate(names)}
    base = (
        base_identifiers if base_identifiers is not None else ["<blank>"] + [f"<base {i}>" for i in range(1, base_rows)]
    )
    identifiers = [*base, *names]
    splits = {
        "train": pack_arc_groups(train_groups, ids, side, True, rng, len(identifiers)),
        "test": pack_arc_groups(test_groups, ids, side, False, rng, len(identifiers)),
    }
    test_puzzles = None
    if any(unlabelled):  # no output to score against: every label token is the ignore label (PAD)
        labels = np.array(splits["test"].labels)
        labels[np.array(unlabelled)] = 0
        splits["test"] = dataclasses.replace(splits["test"], labels=labels)
        test_puzzles = {ref.name: {"test": ref.read()["test"]} for ref in refs}
        log.warning(
            "%d of %d test inputs have no output: arc-eval writes their answers to submission.json and "
            "counts them as not passed (labels from the dataset's test_puzzles.json)",
            open_inputs,
            sum(len(group[0][1]) for group in test_groups),  # the original copy's test pairs, per task
        )
    log.info("%d new tasks, %d puzzle identifiers from %d", len(refs), len(names), base_rows)
    return NewTasks(splits, identifiers, {ref.name: task_sha256(ref) for ref in refs}, base_rows, test_puzzles)
