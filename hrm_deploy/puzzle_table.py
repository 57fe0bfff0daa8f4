"""Puzzle-embedding tables kept out of the graph (``export --puzzle-emb external``).

ARC checkpoints carry a table of one row per puzzle identifier: upstream's ARC-1 model has
[1045829, 512] float32, 2.1 GB, which would otherwise sit inside every graph and engine. An
external export writes the table beside the graph as ``<graph>.puzzle_emb.npy`` (a companion
in its manifest, sha256-checked) and the graph takes the batch's rows, ``puzzle_emb_rows``
float32 [B, puzzle_emb_ndim], in place of ``puzzle_identifiers``. Runners keep taking
identifiers: :class:`PuzzleTable` gathers the rows on the host from the memory-mapped file
(only the rows a batch uses are read from disk), and refuses an identifier outside the table
with one line naming both sizes.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.contract import PUZZLE_ROWS  # the graph input that replaces puzzle_identifiers
from hrm_deploy.errors import ArtifactError, DataError

TABLE_SUFFIX = ".puzzle_emb.npy"  # written beside the graph: <graph>.puzzle_emb.npy
MANIFEST_KEY = "puzzle_emb"  # the export manifest's record: {"placement", "file", "shape", "input"}


class Placement(str, enum.Enum):
    """Where an export keeps the puzzle-embedding table."""

    EMBEDDED = "embedded"  # inside the graph (and any engine built from it)
    EXTERNAL = "external"  # a .npy beside the graph; the graph takes the gathered rows


def table_path(artifact: str | Path) -> Path:
    """Where an external export keeps its table: ``<artifact>.puzzle_emb.npy`` beside it."""
    artifact = Path(artifact)
    return artifact.with_name(artifact.name + TABLE_SUFFIX)


def _check_finite(table: np.ndarray, where: str, chunk_rows: int = 1 << 16) -> None:
    """Refuse a table with a NaN or infinite value: that puzzle's answers would be garbage without a
    word. Scanned in chunks of a memory-mapped file (about a second per GB), once per load."""
    for start in range(0, table.shape[0], chunk_rows):
        block = np.asarray(table[start : start + chunk_rows])
        finite = np.isfinite(block).all(axis=1)
        if not finite.all():
            row = start + int(np.argmin(finite))
            raise ArtifactError(
                f"{where}: row {row} of the puzzle-embedding table holds NaN or infinite values; the table is "
                "damaged: export the graph again from its checkpoint"
            )


class PuzzleTable:
    """A puzzle-embedding table [num_ids, dim] float32 (memory-mapped when read from a file)."""

    def __init__(self, table: np.ndarray, where: str):
        if table.ndim != 2 or table.dtype != np.float32:
            raise ArtifactError(
                f"{where} is not a puzzle-embedding table (float32 [rows, dim]); got {table.dtype} "
                f"{list(table.shape)}: re-export the graph with --puzzle-emb external"
            )
        _check_finite(table, where)
        self.table, self.where = table, where

    @classmethod
    def load(cls, path: str | Path) -> PuzzleTable:
        """Memory-map ``path`` (a ``.npy``); the rows are read when a batch gathers them."""
        if not Path(path).is_file():
            raise ArtifactError(
                f"{path} is missing: a graph exported with --puzzle-emb external needs the table written beside "
                "it; put it back or export again"
            )
        try:
            table = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ArtifactError(f"{path} is not a readable .npy puzzle-embedding table ({exc})") from None
        return cls(table, str(path))

    @property
    def rows(self) -> int:
        return int(self.table.shape[0])

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """The rows of ``ids`` [B] as float32 [B, dim] (a fresh contiguous array)."""
        ids = np.asarray(ids).reshape(-1)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.rows):
            bad = int(ids.max()) if int(ids.max()) >= self.rows else int(ids.min())
            raise DataError(
                f"puzzle identifier {bad} is outside the puzzle-embedding table {Path(self.where).name} "
                f"({self.rows} rows, identifiers 0..{self.rows - 1}); use the dataset the model was trained on"
            )
        return np.ascontiguousarray(self.table[ids.astype(np.int64)], dtype=np.float32)

    def record(self, file: str) -> dict[str, Any]:
        """The export manifest's record of this table as ``file`` beside the graph (how the
        runners find and check it)."""
        return {
            "placement": Placement.EXTERNAL.value,
            "file": file,
            "shape": list(self.table.shape),
            "dtype": "float32",
            "input": PUZZLE_ROWS,
            "bytes_outside_graph": int(self.table.nbytes),
        }

    def feeds(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``feeds`` with ``puzzle_identifiers`` replaced by their rows (``puzzle_emb_rows``)."""
        out = {k: v for k, v in feeds.items() if k != "puzzle_identifiers"}
        out[PUZZLE_ROWS] = self.gather(feeds["puzzle_identifiers"])
        return out


def given_table_error(artifact: str | Path) -> ArtifactError:
    """The one line for a puzzle-embedding table given to an artifact that keeps its table inside."""
    return ArtifactError(
        f"{Path(artifact).name} keeps its puzzle-embedding table inside the graph, so it cannot take another "
        "table (--puzzle-table): export the checkpoint with --puzzle-emb external, or export the adapted checkpoint"
    )


def write_table(path: str | Path, table: np.ndarray) -> PuzzleTable:
    """Save ``table`` [num_ids, dim] as float32 ``.npy`` at ``path``; returns it memory-mapped."""
    np.save(path, np.asarray(table, dtype=np.float32))
    return PuzzleTable.load(path)


class RowsSession:
    """An ONNX Runtime session of an external-table graph that takes ``puzzle_identifiers`` like
    any other: each ``run`` gathers their rows. Everything else is the session's own."""

    def __init__(self, session: Any, table: PuzzleTable):
        self.session, self.table = session, table

    def run(self, names: Any, feeds: dict[str, np.ndarray], *args: Any, **kwargs: Any) -> Any:
        if "puzzle_identifiers" in feeds:
            feeds = self.table.feeds(feeds)
        return self.session.run(names, feeds, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)


def rows_session(session: Any, artifact: str | Path, manifest: dict[str, Any] | None = None) -> Any:
    """``session`` (ONNX Runtime, over the graph at ``artifact``) as a :class:`RowsSession` when the
    graph takes ``puzzle_emb_rows``, so callers keep feeding ``puzzle_identifiers``; else as is."""
    if not any(i.name == PUZZLE_ROWS for i in session.get_inputs()):
        return session
    if manifest is None:
        from hrm_deploy.manifest import check_artifact

        manifest = check_artifact(artifact)
    return RowsSession(session, external_table(artifact, manifest))


def external_table(artifact: str | Path, manifest: dict[str, Any] | None) -> PuzzleTable:
    """The table of an artifact whose graph takes ``puzzle_emb_rows``: named in its manifest or,
    for a graph or engine made from an external export, in the nearest parent's manifest (the
    table stays beside the export it was written with). The parent's manifest, and with it the
    table's sha256, is checked."""
    from hrm_deploy.manifest import check_artifact, manifest_path, resolve_parent

    where, data = Path(artifact), manifest or {}
    for _ in range(6):
        record = data.get(MANIFEST_KEY) or {}
        if record.get("placement") == Placement.EXTERNAL.value:
            path = where.with_name(str(record["file"]))
            table = PuzzleTable.load(path)
            if list(table.table.shape) != list(record.get("shape", table.table.shape)):
                raise ArtifactError(
                    f"{path} has shape {list(table.table.shape)} but {where.name}'s manifest says "
                    f"{record['shape']}; keep the table written with the graph"
                )
            return table
        parent = resolve_parent(where, data) if data else None
        if parent is None or not manifest_path(parent).is_file():  # e.g. the checkpoint: no record there
            break
        data, where = check_artifact(parent, require_manifest=True) or {}, parent
    raise ArtifactError(
        f"{Path(artifact).name} takes puzzle-embedding rows ({PUZZLE_ROWS}) but no table was found: keep "
        f"the export's {TABLE_SUFFIX} file and manifest beside it, as written"
    )
