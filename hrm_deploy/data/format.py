"""Upstream HRM's dataset format, read and written exactly.

<root>/identifiers.json                      id -> name (list)
<root>/{train,test}/dataset.json             PuzzleDatasetMetadata
<root>/{train,test}/<set>__<field>.npy       inputs, labels [N_ex, seq_len] (uint8 as upstream writes),
                                             puzzle_identifiers [N_puz] int32,
                                             puzzle_indices [N_puz+1], group_indices [N_grp+1] int32
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.errors import DataError

FIELDS = ("inputs", "labels", "puzzle_identifiers", "puzzle_indices", "group_indices")
SPLITS = ("train", "test")


@dataclass(frozen=True)
class DatasetMetadata:
    """Upstream ``PuzzleDatasetMetadata`` (dataset.json)."""

    seq_len: int
    vocab_size: int
    pad_id: int = 0
    ignore_label_id: int | None = 0
    blank_identifier_id: int = 0
    num_puzzle_identifiers: int = 1
    total_groups: int = 0
    mean_puzzle_examples: float = 1.0
    sets: list[str] = field(default_factory=lambda: ["all"])

    @classmethod
    def from_json(cls, path: Path) -> DatasetMetadata:
        try:
            data = json.loads(path.read_text())
            known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
            return cls(**known)
        except (json.JSONDecodeError, UnicodeDecodeError, TypeError) as exc:
            raise DataError(f"{path} is not a valid dataset.json ({exc}); rebuild the dataset") from None


@dataclass
class Split:
    """One split's arrays for one set."""

    metadata: DatasetMetadata
    inputs: np.ndarray
    labels: np.ndarray
    puzzle_identifiers: np.ndarray
    puzzle_indices: np.ndarray
    group_indices: np.ndarray

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def example_puzzle_ids(self) -> np.ndarray:
        """Puzzle identifier of every example (expands puzzle_indices)."""
        counts = np.diff(self.puzzle_indices)
        return np.repeat(self.puzzle_identifiers, counts).astype(np.int32)

    def validate(self, where: str) -> None:
        m = self.metadata
        if self.inputs.ndim != 2 or self.inputs.shape[1] != m.seq_len:
            raise DataError(
                f"{where}: inputs have shape {self.inputs.shape}, expected [N, {m.seq_len}] (dataset.json seq_len)"
            )
        if self.labels.shape != self.inputs.shape:
            raise DataError(f"{where}: labels shape {self.labels.shape} differs from inputs {self.inputs.shape}")
        if int(self.inputs.max(initial=0)) >= m.vocab_size:
            raise DataError(f"{where}: token id {int(self.inputs.max())} >= vocab_size {m.vocab_size}")
        if self.puzzle_indices.shape[0] != self.puzzle_identifiers.shape[0] + 1 or int(self.puzzle_indices[-1]) != len(
            self
        ):
            raise DataError(f"{where}: puzzle_indices do not cover the {len(self)} examples; the dataset is damaged")
        if self.puzzle_identifiers.size and int(self.puzzle_identifiers.max()) >= m.num_puzzle_identifiers:
            raise DataError(f"{where}: puzzle identifier >= num_puzzle_identifiers {m.num_puzzle_identifiers}")


def load_split(root: str | Path, split: str = "test", set_name: str | None = None, mmap: bool = True) -> Split:
    """Load ``<root>/<split>`` (one set; the first listed if not named)."""
    folder = Path(root) / split
    meta_path = folder / "dataset.json"
    if not meta_path.is_file():
        raise DataError(
            f"{meta_path} not found; pass the dataset folder that holds train/ and test/ "
            "(built by upstream's dataset scripts or `hrm-deploy data`)"
        )
    meta = DatasetMetadata.from_json(meta_path)
    set_name = set_name or meta.sets[0]
    arrays = {}
    for name in FIELDS:
        path = folder / f"{set_name}__{name}.npy"
        if not path.is_file():
            raise DataError(f"{path} is missing; the dataset is incomplete, rebuild it")
        try:
            arrays[name] = np.load(path, mmap_mode="r" if mmap else None)
        except (ValueError, OSError) as exc:
            raise DataError(f"{path} is not a readable .npy file ({exc}); rebuild the dataset") from None
    result = Split(meta, **arrays)
    result.validate(str(folder))
    return result


def ensure_new_folder(root: str | Path) -> None:
    """Datasets are never written over: an existing non-empty folder is an error; so is a
    symlink (written through, the dataset would land elsewhere) or a path through a link that
    leads out of the workspace."""
    from hrm_deploy.errors import ArtifactError
    from hrm_deploy.io import check_output_path
    from hrm_deploy.manifest import output_path

    root = Path(root)
    if root.is_symlink():  # its target as written (resolving a link loop would raise)
        raise DataError(
            f"{root} is a symbolic link (to {os.readlink(root)}); give the real folder path, "
            "datasets are never written through a link"
        )
    try:
        output_path(root, None, flag="--output", folder=True)  # the rule of every -o: a file is not a folder
        check_output_path(root)
    except ArtifactError as exc:
        raise DataError(str(exc)) from None
    ancestor = root.absolute().parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise DataError(f"{root}: {ancestor} is a file, not a folder; choose another --output")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise DataError(f"{root} already exists and is not empty; choose another --output or delete it")


# Generation keeps every example as small numpy arrays in Python lists before packing (about
# 20 bytes per cell plus 400 of object overhead, measured order of magnitude); on disk a
# example is its input and label (uint8) plus 12 bytes of indices.
MEMORY_BYTES_PER_CELL = 20
MEMORY_BYTES_PER_EXAMPLE = 400


def check_dataset_size(examples: int, seq_len: int, output: str | Path | None, flag: str = "--train/--test") -> None:
    """Refuse, before any work, a dataset that would not fit in memory or on ``output``'s disk
    (an estimate, with a margin: at most half of what is free)."""
    from hrm_deploy.system import available_memory_bytes, free_disk_bytes

    memory = examples * (seq_len * MEMORY_BYTES_PER_CELL + MEMORY_BYTES_PER_EXAMPLE)
    disk = examples * (2 * seq_len + 12)
    free_memory = available_memory_bytes()
    if free_memory is not None and memory > free_memory // 2:
        raise DataError(
            f"{flag}: {examples:,} examples need about {memory / 2**30:.1f} GiB of memory to generate, "
            f"{free_memory / 2**30:.1f} GiB is available; generate fewer (at most about "
            f"{free_memory // 2 // (seq_len * MEMORY_BYTES_PER_CELL + MEMORY_BYTES_PER_EXAMPLE):,})"
        )
    free_disk = free_disk_bytes(output) if output else None
    if free_disk is not None and disk > free_disk // 2:
        raise DataError(
            f"{flag}: {examples:,} examples need about {disk / 2**30:.1f} GiB on disk, {output} has "
            f"{free_disk / 2**30:.1f} GiB free; generate fewer or write elsewhere"
        )


# Upstream's PuzzleDatasetMetadata field order: dataset.json is written in it, byte for byte as upstream's.
METADATA_ORDER = (
    "pad_id",
    "ignore_label_id",
    "blank_identifier_id",
    "vocab_size",
    "seq_len",
    "num_puzzle_identifiers",
    "total_groups",
    "mean_puzzle_examples",
    "sets",
)


def upstream_json(metadata: DatasetMetadata) -> dict[str, Any]:
    """dataset.json's fields in upstream's order (``mean_puzzle_examples`` a float, as pydantic writes it)."""
    fields = asdict(metadata)
    fields["mean_puzzle_examples"] = float(fields["mean_puzzle_examples"])
    return {k: fields[k] for k in METADATA_ORDER}


def save_dataset(root: str | Path, splits: dict[str, Split], identifiers: list[str]) -> Path:
    """Write a dataset atomically: built in a private staging folder beside ``root`` (removed
    on any exit; a killed run's is removed by the next write there), then renamed."""
    from hrm_deploy.io import staging_dir

    root = Path(root)
    ensure_new_folder(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    with staging_dir(root.parent, "stage") as staging:
        data = staging / "data"
        data.mkdir()
        for split_name, split in splits.items():
            split.validate(f"{split_name} split")
            folder = data / split_name
            folder.mkdir()
            set_name = split.metadata.sets[0]
            for name in FIELDS:
                np.save(folder / f"{set_name}__{name}.npy", np.asarray(getattr(split, name)))
            (folder / "dataset.json").write_text(json.dumps(upstream_json(split.metadata)))
        (data / "identifiers.json").write_text(json.dumps(identifiers))
        if root.exists():
            root.rmdir()
        data.rename(root)
    return root


def select_examples(split: Split, k: int, seed: int = 0) -> np.ndarray:
    """Deterministic choice of ``k`` example indices (sorted), for calibration and verify subsets."""
    n = len(split)
    if k >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))


def check_fits_model(meta: DatasetMetadata, config: Any, where: str) -> None:
    """A dataset must match the model's seq_len / vocab / puzzle ids."""
    for name, model_value in (("seq_len", config.seq_len), ("vocab_size", config.vocab_size)):
        if getattr(meta, name) != model_value:
            raise DataError(
                f"{where}: dataset {name} {getattr(meta, name)} != model {name} {model_value}; "
                "use the dataset the model was trained on"
            )
    if meta.num_puzzle_identifiers > config.num_puzzle_identifiers:
        raise DataError(
            f"{where}: dataset has {meta.num_puzzle_identifiers} puzzle identifiers, "
            f"model only {config.num_puzzle_identifiers}"
        )


def pack_groups(inputs: list[list[np.ndarray]], labels: list[list[np.ndarray]], seq_len: int, vocab_size: int) -> Split:
    """Pack groups of (variants of) puzzles, already token-encoded, into upstream's arrays:
    one example per puzzle, one group per original puzzle, one puzzle identifier (0)."""
    flat_in, flat_lab, puzzle_indices, group_indices = [], [], [0], [0]
    for group_in, group_lab in zip(inputs, labels):
        for x, y in zip(group_in, group_lab):
            flat_in.append(np.asarray(x, dtype=np.uint8).flatten())
            flat_lab.append(np.asarray(y, dtype=np.uint8).flatten())
            puzzle_indices.append(len(flat_in))
        group_indices.append(len(puzzle_indices) - 1)
    meta = DatasetMetadata(
        seq_len=seq_len,
        vocab_size=vocab_size,
        pad_id=0,
        ignore_label_id=0,
        blank_identifier_id=0,
        num_puzzle_identifiers=1,
        total_groups=len(group_indices) - 1,
        mean_puzzle_examples=1.0,
        sets=["all"],
    )
    n_puz = len(puzzle_indices) - 1
    return Split(
        meta,
        np.array(flat_in, dtype=np.uint8).reshape(-1, seq_len),
        np.array(flat_lab, dtype=np.uint8).reshape(-1, seq_len),
        np.zeros(n_puz, dtype=np.int32),
        np.array(puzzle_indices, dtype=np.int32),
        np.array(group_indices, dtype=np.int32),
    )
