"""No rebuild after ``adapt``: an external-table export of the base answers the new tasks with the
adapted table (``arc-eval ARTIFACT --data NEW --puzzle-table ADAPTED``).

A graph exported with ``--puzzle-emb external`` (and every engine built from it) takes the batch's
table rows, gathered on the host, instead of puzzle identifiers (:mod:`hrm_deploy.puzzle_table`).
``adapt --train embeddings`` changes nothing but new rows appended to the table, so the same graph
with the longer table is the adapted model. What makes that true is checked here, each fault one
line: the table's width and dtype are the export's, it extends the export's table (its first rows
are the export's, bit for bit), the adapt run's record names the checkpoint the export was made
from (by sha256), the adapted checkpoint is the one the run wrote (by sha256, recorded when the run
ended), only the table was trained, and the dataset scored is the adapt run's own.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.arc.adapt import CHECKPOINT, RECORD, TABLE_KEY, read_record
from hrm_deploy.errors import ConfigError
from hrm_deploy.io import sha256_file
from hrm_deploy.puzzle_table import MANIFEST_KEY, Placement, PuzzleTable, given_table_error

log = logging.getLogger(__name__)


def _export_record(artifact: Path) -> tuple[Path, dict[str, Any]]:
    """(path, manifest) of the external-table export ``artifact`` is (or was built from)."""
    from hrm_deploy.manifest import check_artifact, manifest_path, resolve_parent

    where, data = artifact, check_artifact(artifact, require_manifest=True) or {}
    for _ in range(6):
        if (data.get(MANIFEST_KEY) or {}).get("placement") == Placement.EXTERNAL.value:
            return where, data
        parent = resolve_parent(where, data)
        if parent is None or not manifest_path(parent).is_file():
            break
        where, data = parent, check_artifact(parent, require_manifest=True) or {}
    raise given_table_error(artifact)


def _adapted_checkpoint(given: Path) -> tuple[Path, dict[str, Any]]:
    """(checkpoint, adapt record) of what ``--puzzle-table`` names: an adapt output folder or a
    checkpoint in one."""
    folder = given if given.is_dir() else given.parent
    if not (folder / RECORD).is_file():
        raise ConfigError(
            f"--puzzle-table {given}: no {RECORD} there; give the output folder of `hrm-deploy adapt` (or its "
            f"{CHECKPOINT}), whose record names the base checkpoint"
        )
    checkpoint, record = (folder / CHECKPOINT if given.is_dir() else given), read_record(folder)
    recorded = record.get("checkpoint_sha256")
    if not recorded:
        raise ConfigError(
            f"--puzzle-table {given}: the adapt run in {folder} has not finished ({RECORD} records no checkpoint "
            "sha256 yet); finish it with `hrm-deploy adapt ... --resume`, then give it again"
        )
    if not checkpoint.is_file() or sha256_file(checkpoint) != recorded:
        raise ConfigError(
            f"--puzzle-table {given}: {checkpoint} is not the checkpoint the adapt run wrote (its sha256 differs from "
            f"{RECORD}'s record): it was changed or replaced after adapt; adapt again"
        )
    return checkpoint, record


def _check_dataset(data: Path, folder: Path, record: dict[str, Any]) -> None:
    """The dataset to score must be the adapt run's own (or a copy): its identifiers and test rows, byte
    for byte. Another run's rows would answer other tasks without a word."""
    import filecmp

    adapted = folder / str(record.get("data", "data"))
    names = ["identifiers.json", "test/all__inputs.npy", "test/all__puzzle_identifiers.npy"]
    for name in names:
        if not (data / name).is_file() or not (adapted / name).is_file():
            return  # a layout of another builder: the dataset's own checks speak for it
        if not filecmp.cmp(data / name, adapted / name, shallow=False):
            raise ConfigError(
                f"--data {data} is not the dataset of the adapt run in {folder} ({name} differs): its table "
                f"answers that run's tasks; score {adapted} with it"
            )


def load_adapted_table(artifact: str | Path, given: str | Path, data: str | Path | None = None) -> PuzzleTable:
    """The adapted table ``given`` names, checked against the external-table ``artifact`` (an ONNX
    graph or an engine) it will be fed to and, when given, the dataset ``data`` to be scored; see
    the module's docstring."""
    import torch

    from hrm_deploy.model.checkpoint import read_checkpoint
    from hrm_deploy.puzzle_table import table_path
    from hrm_deploy.registry import artifact_kind

    if "://" in str(artifact):
        raise ConfigError(
            f"--puzzle-table needs a local ONNX graph or engine; the server at {artifact} keeps its own table: "
            "serve the adapted checkpoint, or score its graph here"
        )
    artifact, given = Path(artifact), Path(given)
    if not artifact.exists():
        raise ConfigError(f"--puzzle-table needs a local ONNX graph or engine; {artifact} does not exist")
    if artifact_kind(artifact) == "checkpoint":
        raise ConfigError(
            f"--puzzle-table is for a graph or engine exported with --puzzle-emb external; {artifact.name} is a "
            "checkpoint with its own table: evaluate the adapted checkpoint itself"
        )
    export_path, export = _export_record(artifact)
    checkpoint, record = _adapted_checkpoint(given)
    if data is not None:
        _check_dataset(Path(data), checkpoint.parent, record)
    if record.get("train") != "embeddings":
        raise ConfigError(
            f"--puzzle-table {given}: it was adapted with --train {record.get('train')}, which changed the model's "
            "weights too; export the adapted checkpoint instead"
        )
    base_sha = (export.get("parent") or {}).get("sha256")
    if base_sha != record["base"]["sha256"]:
        raise ConfigError(
            f"--puzzle-table {given} was adapted from {Path(record['base']['path']).name} (sha256 "
            f"{record['base']['sha256'][:12]}) but {artifact.name} was exported from another checkpoint (sha256 "
            f"{str(base_sha)[:12]}); adapt the checkpoint the artifact was exported from, or export the adapted one"
        )
    table = read_checkpoint(checkpoint).state_dict.get(TABLE_KEY)
    if not isinstance(table, torch.Tensor) or table.dtype != torch.float32 or table.ndim != 2:
        raise ConfigError(f"--puzzle-table {checkpoint} holds no float32 [rows, dim] puzzle-embedding table")
    shape = export[MANIFEST_KEY]["shape"]
    array = table.numpy()
    if array.shape[1] != shape[1] or array.shape[0] < shape[0]:
        raise ConfigError(
            f"--puzzle-table {checkpoint}: its table is float32 {list(array.shape)} but {artifact.name} takes rows of "
            f"{shape[1]} values from a table of at least {shape[0]} rows; give the table adapted from its checkpoint"
        )
    export_file = table_path(export_path)
    base_rows = np.load(export_file, mmap_mode="r")
    if not np.array_equal(array[: shape[0]], base_rows):
        raise ConfigError(
            f"--puzzle-table {checkpoint}: its first {shape[0]} rows differ from {export_file.name}; the base "
            "changed after adapt or the table is not an adaptation of it: adapt again"
        )
    log.info("%s: the adapted table %s, %d new rows", artifact.name, list(array.shape), array.shape[0] - shape[0])
    return PuzzleTable(array, str(checkpoint))
