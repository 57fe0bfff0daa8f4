"""Default data from a checkpoint's own provenance, so the user's commands run as written
(``hrm-deploy build-engine --int8``, ``hrm-deploy bench``, ``hrm-deploy verify ARTIFACT``).

In order: a dataset spec stored in the checkpoint (bundled presets and checkpoints written by
``scripts/refresh_bundled_checkpoint.py``) is regenerated deterministically into a cache
folder (``$HRM_DEPLOY_CACHE``, else the platform's user cache dir); else the data path a checkpoint
records (our trainer's ``train_config.data_path``, upstream's ``all_config.yaml`` ``data_path``,
resolved as the loader does). With none of these: one error naming the flag to pass.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hrm_deploy.artifacts import is_checkpoint, recorded_data, recorded_overrides
from hrm_deploy.errors import ArtifactError, ConfigError


@dataclass(frozen=True)
class DataChoice:
    """The dataset folder chosen and a one-line announcement of why."""

    path: Path
    message: str


def cache_dir() -> Path:
    """The user cache folder (:func:`hrm_deploy.io.cache_dir`)."""
    from hrm_deploy.io import cache_dir as user_cache

    return user_cache()


def checkpoint_of(artifact: str | Path) -> Path:
    """The checkpoint behind an artifact: itself, or (ONNX graphs, engines of every kind the
    suffix table knows) its manifests' parent chain."""
    return _source_of(artifact)[0]


def _source_of(artifact: str | Path) -> tuple[Path, dict[str, Any] | None]:
    """:func:`checkpoint_of`, and what the chain's export recorded of the checkpoint's training data
    (:func:`~hrm_deploy.artifacts.recorded_data`; None for a checkpoint itself or an older export)."""
    path = Path(artifact)
    if is_checkpoint(path):
        return path, None
    return recorded_data(path)


def _folder(spec: dict[str, Any]) -> Path:
    """The cache folder of a dataset spec (same spec, same data, same folder)."""
    fields = {k: v for k, v in spec.items() if k not in ("generator", "workers")}
    key = hashlib.sha256(
        json.dumps({"generator": spec.get("generator"), **fields}, sort_keys=True, default=list).encode()
    )
    return cache_dir() / "datasets" / f"{spec.get('generator')}-{key.hexdigest()[:12]}"


def _ready(folder: Path) -> bool:
    return (folder / "train" / "dataset.json").is_file() and (folder / "test" / "dataset.json").is_file()


def _regenerate(spec: dict[str, Any], quiet: bool = False) -> Path:
    """The stored dataset spec's dataset, generated once into the cache (same spec, same data),
    with a progress line and one line saying what was made and where."""
    generator = spec.get("generator")
    fields = {k: v for k, v in spec.items() if k not in ("generator", "workers")}
    folder = _folder(spec)
    if _ready(folder):
        return folder
    import logging
    import shutil
    import tempfile
    import time

    from hrm_deploy.progress import progress

    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    total, start = int(fields.get("train", 0)) + int(fields.get("test", 0)), time.perf_counter()
    try:
        with progress(total, f"generating {generator} puzzles", quiet or total < 2000, unit="puzzles") as advance:
            if generator == "sudoku":
                from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

                tuples = {k: tuple(v) for k, v in fields.items() if isinstance(v, list)}
                generate_sudoku(SudokuSpec(**{**fields, **tuples}), str(work / "data"), progress=advance)
            elif generator == "maze":
                from hrm_deploy.data.maze import MazeSpec, generate_maze

                generate_maze(MazeSpec(**fields), str(work / "data"))
                advance(total)
            else:
                raise ConfigError(
                    f"the checkpoint's dataset spec names generator {generator!r}, which this version cannot regenerate"
                )
        try:
            os.replace(work / "data", folder)  # atomic: a half-written cache folder is never seen
        except OSError:
            if not _ready(folder):  # not another process that made the same data first
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    logging.getLogger(__name__).info(
        "generated %d %s puzzles (%s) in %.0f s into %s",
        total,
        generator,
        _describe(spec),
        time.perf_counter() - start,
        folder,
    )
    return folder


def _only_needed(spec: dict[str, Any], splits: dict[str, int | None] | None) -> dict[str, Any]:
    """``spec`` cut to the puzzles a command reads: ``splits`` maps a split to the count it needs
    (None: all of it); a split not named gets one puzzle (the format needs both). Every puzzle has
    its own random stream (seed, split, index), so the cut splits are exact prefixes of the full
    ones. With ``splits`` None: the full spec. (Never "the full one if it happens to be cached":
    the same command must read the same puzzles whatever the cache holds.)"""
    if splits is None:
        return spec
    cut = dict(spec)
    for split in ("train", "test"):
        full = int(spec.get(split, 0))
        want = splits.get(split, 1) if split in splits else 1
        cut[split] = full if want is None else min(full, max(1, int(want)))
    return cut


def _describe(spec: dict[str, Any]) -> str:
    parts = [f"{spec.get('train')} train / {spec.get('test')} test"]
    if "blanks" in spec:
        lo, hi = spec["blanks"]
        parts.append(f"{lo}-{hi} blanks")
    if "size" in spec:
        parts.append(f"{spec['size']}x{spec['size']}")
    parts.append(f"seed {spec.get('seed')}")
    return f"{spec.get('generator')}, " + ", ".join(parts)


def provenance_data(
    checkpoint: str | Path,
    flag: str,
    splits: dict[str, int | None] | None = None,
    overrides: dict[str, Any] | None = None,
    recorded: dict[str, Any] | None = None,
) -> DataChoice:
    """The dataset a checkpoint was trained on (see the module doc); ``flag`` names the option
    the user would otherwise pass, for the announcement and the error. ``splits``: what the command
    reads (e.g. ``{"train": 128}`` to calibrate), so a regenerated dataset makes only that.
    ``overrides``: the config fields an artifact was exported with (``recorded_overrides``), which
    the checkpoint alone cannot tell (e.g. an upstream one without its dataset.json: seq_len).
    ``recorded``: what an export's manifest recorded of the checkpoint's data
    (:func:`~hrm_deploy.artifacts.recorded_data`): a dataset spec there spares reading the
    checkpoint (and importing torch); a data path is resolved beside the checkpoint, read for it."""
    name = Path(checkpoint).name
    where: Path | None = None
    if recorded is None or not recorded.get("dataset"):
        from hrm_deploy.model.checkpoint import read_checkpoint

        contents = read_checkpoint(checkpoint, **(overrides or {}))
        recorded, where = contents.data_record(), contents.path.parent
    spec = recorded.get("dataset")
    if isinstance(spec, dict) and spec.get("generator"):
        made = _only_needed(spec, splits)
        folder = _regenerate(made)
        part = "" if made == spec else f"; the {made['train']} train / {made['test']} test puzzles this command reads"
        return DataChoice(
            folder,
            f"no {flag} given: using {name}'s own dataset, regenerated from its provenance "
            f"({_describe(spec)}{part}) in {folder}",
        )
    data_path = recorded.get("data_path")
    if data_path and where is not None:
        from hrm_deploy.model.checkpoint import _find_dataset_json

        meta = _find_dataset_json(str(data_path), where)
        if meta is not None:
            folder = meta.parent.parent
            return DataChoice(folder, f"no {flag} given: using the dataset {name} was trained on ({folder})")
        raise ConfigError(
            f"{name} was trained on {data_path}, which is not here (no train/ or test/dataset.json "
            f"found as given or beside the checkpoint); pass {flag} DATASET_DIR"
        )
    raise ConfigError(f"{name} records no dataset it was trained on; pass {flag} DATASET_DIR")


def default_data(
    artifact: str | Path,
    flag: str,
    splits: dict[str, int | None] | None = None,
    overrides: dict[str, Any] | None = None,
) -> DataChoice:
    """Default data for a command on ``artifact`` (checkpoint, ONNX or engine); ``splits`` and
    ``overrides`` as in :func:`provenance_data` (None: those ``artifact``'s manifests recorded). A
    damaged artifact or manifest is named first (it, not the data, is the problem)."""
    from hrm_deploy.manifest import check_artifact

    if Path(artifact).is_file():
        check_artifact(artifact)
    try:
        checkpoint, recorded = _source_of(artifact)
        if overrides is None:
            overrides = {} if is_checkpoint(artifact) else recorded_overrides(artifact)
    except ArtifactError:
        if Path(artifact).suffix == ".onnx" and Path(artifact).is_file():
            from hrm_deploy.onnx_runtime import load_onnx

            load_onnx(artifact)  # a truncated graph is named as one
        raise ConfigError(
            f"no {flag} given and the checkpoint {Path(artifact).name} came from is unknown (no "
            f"manifest names it, or it changed); pass {flag} DATASET_DIR"
        ) from None
    return provenance_data(checkpoint, flag, splits, overrides, recorded)


HELDOUT_SEED_OFFSET = 1_000_003  # a seed stream the checkpoint's own dataset never used


def heldout_data(artifact: str | Path, samples: int = 512) -> DataChoice | None:
    """Fresh puzzles of the checkpoint's own dataset spec from a seed its data never used (in
    the ``train`` split), for calibrations that must not see training data; None when the
    checkpoint stores no dataset spec."""
    from hrm_deploy.errors import CheckpointError
    from hrm_deploy.model.checkpoint import read_checkpoint

    try:
        checkpoint, recorded = _source_of(artifact)
        spec = (recorded or {}).get("dataset") or read_checkpoint(checkpoint).extra.get("dataset")
    except (ArtifactError, CheckpointError, ConfigError):
        return None
    if not isinstance(spec, dict) or spec.get("generator") not in ("sudoku", "maze"):
        return None
    fresh = {**spec, "train": int(samples), "test": 1, "seed": int(spec.get("seed", 0)) + HELDOUT_SEED_OFFSET}
    if spec["generator"] == "sudoku":
        fresh["augment"] = 0
    else:
        fresh["augment"] = False
    folder = _regenerate(fresh)
    return DataChoice(
        folder,
        f"{samples} fresh puzzles of {Path(checkpoint).name}'s dataset spec "
        f"(seed {fresh['seed']}, never trained on) in {folder}",
    )


# ------------------------------------------------------------------ the reference an artifact was built from
def reference_files(checkpoint: str | Path | None) -> dict[str, str]:
    """sha256 of the files besides the weights that decide the reference model of ``checkpoint``:
    upstream's ``all_config.yaml`` beside it and the ``dataset.json`` its ``data_path``/``data_paths``
    point to (seq_len, vocabulary, puzzle ids). Paths relative to the checkpoint's folder; {} for ours."""
    if checkpoint is None or not Path(checkpoint).is_file():
        return {}
    from hrm_deploy.io import sha256_file
    from hrm_deploy.model.checkpoint import _find_dataset_json, _read_yaml

    folder = Path(checkpoint).parent
    config = folder / "all_config.yaml"
    if not config.is_file():
        return {}
    found = [config]
    try:
        train_cfg = _read_yaml(config)
    except ConfigError:
        train_cfg = {}
    listed = train_cfg.get("data_paths")
    paths: list[Any] = list(listed) if isinstance(listed, list) else []
    for data_path in [*paths, train_cfg.get("data_path")]:
        meta = _find_dataset_json(str(data_path), folder) if data_path else None
        if meta is not None and meta not in found:
            found.append(meta)
    return {os.path.relpath(f, folder): sha256_file(f) for f in found}


def _records(artifact: Path) -> tuple[dict[str, Any] | None, dict[str, Any], dict[str, str]]:
    """(the checkpoint's ``parent`` record, its Hub record, its reference files) from ``artifact``'s
    manifest chain (each link checked, :func:`hrm_deploy.manifest.check_artifact`)."""
    from hrm_deploy.manifest import check_artifact, manifest_path, resolve_parent

    current, parent = artifact, None
    hub: dict[str, Any] = {}
    files: dict[str, str] = {}
    for _ in range(16):
        if is_checkpoint(current) or not manifest_path(current).is_file():
            break
        manifest = check_artifact(current) or {}
        if isinstance(manifest.get("hub"), dict):
            hub = manifest["hub"]
        if isinstance(manifest.get("reference_files"), dict):
            files = manifest["reference_files"]
        record = manifest.get("parent")
        if isinstance(record, dict) and is_checkpoint(Path(str(record.get("path")))):
            parent = record
            break
        nxt = resolve_parent(current, manifest)
        if nxt is None:
            break
        current = nxt
    return parent, hub, files


@dataclass(frozen=True)
class Reference:
    """The checkpoint artifacts are compared with, and the config overrides they were exported with
    (:func:`hrm_deploy.artifacts.recorded_overrides`): load it with exactly these."""

    checkpoint: Path
    overrides: dict[str, Any]


def checked_reference(artifacts: list[Path], given: str | Path | None) -> Reference:
    """The reference of ``artifacts``, settled before any work: ``given``, else the checkpoint the
    first one's manifests name; checked against every artifact's record (:func:`check_reference`)
    and read with their recorded overrides (one line if it cannot be: a field it lacks, e.g.)."""
    from hrm_deploy.model.checkpoint import read_checkpoint

    if given is not None:
        checkpoint = Path(given)
    elif artifacts:
        checkpoint = checkpoint_of(artifacts[0])
    else:
        raise ConfigError("no reference checkpoint: pass --reference CKPT")
    recorded = [recorded_overrides(a) for a in artifacts if not is_checkpoint(a)]
    if any(r != recorded[0] for r in recorded):
        raise ConfigError(
            "these artifacts were exported with different checkpoint overrides "
            f"({'; '.join(str(r) for r in recorded)}): they are not one model; compare them one at a time"
        )
    for artifact in artifacts:
        if not is_checkpoint(artifact):
            check_reference(artifact, checkpoint)
    overrides = recorded[0] if recorded else {}
    read_checkpoint(checkpoint, **overrides)  # a reference that cannot load fails now, not after the work
    return Reference(checkpoint, overrides)


def check_reference(artifact: str | Path, reference: str | Path) -> None:
    """One :class:`ArtifactError` line unless ``reference`` and every file its model was read from
    (config, dataset.json, the Hub snapshot's files) are the ones ``artifact``'s manifests hashed: a
    verdict is only given against the reference the artifact was built from. Nothing recorded: no check."""
    from hrm_deploy.io import sha256_file

    artifact, reference = Path(artifact), Path(reference)
    parent, hub, files = _records(artifact)
    if not reference.is_file():
        return  # a checkpoint folder: its newest step is what the loader reads
    digest = sha256_file(reference)
    if parent is not None and parent.get("sha256") not in (None, digest):
        raise ArtifactError(
            f"{reference} is not the checkpoint {artifact.name} was made from (sha256 {digest[:12]}..., recorded "
            f"{str(parent.get('sha256'))[:12]}...); pass that checkpoint, or re-create the artifact from this one"
        )
    checks = {reference.parent / name: sha for name, sha in files.items()}
    hub_files: dict[str, str] = hub["files"] if isinstance(hub.get("files"), dict) else {}
    own = next((name for name, sha in hub_files.items() if sha == digest), None)
    if own is not None:  # the snapshot's files, wherever the reference lies (relative to the weights)
        root = reference.parent
        for _ in Path(own).parts[1:]:
            root = root.parent
        checks.update({root / name: sha for name, sha in hub_files.items()})
    for path, sha in checks.items():
        if not path.is_file():
            raise ArtifactError(
                f"{path} is gone, but {artifact.name} was made with it; restore it, or re-create the artifact"
            )
        if sha256_file(path) != sha:
            raise ArtifactError(
                f"{path} changed since {artifact.name} was made from it (sha256 differs from the manifest's "
                "record): a verdict against it would judge another model; restore it, or re-create the artifact"
            )
