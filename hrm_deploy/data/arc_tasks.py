"""The tasks of an ARC dataset in upstream's format: the task each test row belongs to, read from
the dataset's ``identifiers.json`` (puzzle id -> name, augmented copies named as in
:mod:`hrm_deploy.data.arc_grids`), and the test split's rows per task as ``arc-eval`` runs them.

``arc-eval`` charges its time per task with :func:`row_tasks`; ``bench`` turns puzzles/s into ARC
tasks/s with :func:`arc_test_workload`, so the two count tasks the same way.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hrm_deploy.data.arc_grids import VOCAB_SIZE, parse_name
from hrm_deploy.errors import DataError

log = logging.getLogger(__name__)

IDENTIFIERS = "identifiers.json"


def read_identifiers(data: Path) -> list[str]:
    """The puzzle names of the dataset folder ``data`` (index = puzzle identifier)."""
    path = data / IDENTIFIERS
    try:
        identifiers = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path} is missing or unreadable ({exc}); use the dataset folder as built") from None
    if not isinstance(identifiers, list) or not all(isinstance(name, str) for name in identifiers):
        raise DataError(f"{path} is not a list of puzzle names; use the dataset folder as built")
    return identifiers


def row_tasks(identifiers: Sequence[str], ids: np.ndarray) -> list[str | None]:
    """The ARC task of each row with puzzle identifier ``ids[i]`` (None: the blank identifier 0)."""
    if len(ids) and int(ids.max()) >= len(identifiers):
        raise DataError(
            f"puzzle identifier {int(ids.max())} is outside {IDENTIFIERS} ({len(identifiers)} names); "
            "use the dataset folder as built"
        )
    task_of = {int(i): parse_name(identifiers[int(i)])[0] for i in np.unique(ids) if int(i) != 0}
    return [task_of.get(int(i)) for i in ids]


@dataclass(frozen=True)
class ArcTestWorkload:
    """An ARC test split's size: ``rows`` (every test input in every augmented copy, each run for
    all ACT steps by ``arc-eval``) over ``tasks`` evaluation tasks."""

    data: str
    rows: int
    tasks: int

    @property
    def rows_per_task(self) -> float:
        return self.rows / self.tasks


def arc_test_workload(data: str | Path) -> ArcTestWorkload | None:
    """The test split's rows and tasks when ``data`` is an ARC dataset folder (ARC's vocabulary,
    an ``identifiers.json`` naming the tasks of its test rows); None for any other data (a Sudoku
    or maze dataset, a ``.npz``)."""
    from hrm_deploy.data.format import DatasetMetadata, load_split

    folder = Path(data)
    meta = folder / "test" / "dataset.json"
    if not meta.is_file() or not (folder / IDENTIFIERS).is_file():
        return None
    if DatasetMetadata.from_json(meta).vocab_size != VOCAB_SIZE:  # Sudoku's 11, a maze's 6: not ARC grids
        return None
    split = load_split(folder, "test")
    tasks = {task for task in row_tasks(read_identifiers(folder), split.example_puzzle_ids()) if task is not None}
    if not tasks:  # only the blank identifier: puzzles without names are not ARC tasks
        return None
    workload = ArcTestWorkload(str(folder), len(split), len(tasks))
    log.debug("%s: ARC test split, %d rows over %d tasks", folder, workload.rows, workload.tasks)
    return workload
