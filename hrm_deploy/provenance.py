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

from hrm_deploy.artifacts import find_reference, is_checkpoint
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
    path = Path(artifact)
    if not is_checkpoint(path):
        return find_reference(path)
    return path


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
        if not folder.exists():
            os.replace(work / "data", folder)  # atomic: a half-written cache folder is never seen
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


def provenance_data(checkpoint: str | Path, flag: str, splits: dict[str, int | None] | None = None) -> DataChoice:
    """The dataset a checkpoint was trained on (see the module doc); ``flag`` names the option
    the user would otherwise pass, for the announcement and the error. ``splits``: what the command
    reads (e.g. ``{"train": 128}`` to calibrate), so a regenerated dataset makes only that."""
    from hrm_deploy.model.checkpoint import _find_dataset_json, read_checkpoint

    contents = read_checkpoint(checkpoint)
    name = Path(checkpoint).name
    spec = contents.extra.get("dataset")
    if isinstance(spec, dict) and spec.get("generator"):
        made = _only_needed(spec, splits)
        folder = _regenerate(made)
        part = "" if made == spec else f"; the {made['train']} train / {made['test']} test puzzles this command reads"
        return DataChoice(
            folder,
            f"no {flag} given: using {name}'s own dataset, regenerated from its provenance "
            f"({_describe(spec)}{part}) in {folder}",
        )
    data_path = contents.train_config.get("data_path")
    paths = contents.train_config.get("data_paths")  # a list in some upstream configs (TRM)
    if not data_path and isinstance(paths, list) and paths:
        data_path = paths[0]
    if data_path:
        meta = _find_dataset_json(str(data_path), contents.path.parent)
        if meta is not None:
            folder = meta.parent.parent
            return DataChoice(folder, f"no {flag} given: using the dataset {name} was trained on ({folder})")
        raise ConfigError(
            f"{name} was trained on {data_path}, which is not here (no train/ or test/dataset.json "
            f"found as given or beside the checkpoint); pass {flag} DATASET_DIR"
        )
    raise ConfigError(f"{name} records no dataset it was trained on; pass {flag} DATASET_DIR")


def default_data(artifact: str | Path, flag: str, splits: dict[str, int | None] | None = None) -> DataChoice:
    """Default data for a command on ``artifact`` (checkpoint, ONNX or engine); ``splits`` as in
    :func:`provenance_data`."""
    try:
        checkpoint = checkpoint_of(artifact)
    except ArtifactError:
        raise ConfigError(
            f"no {flag} given and the checkpoint {Path(artifact).name} came from is unknown (no "
            f"manifest names it, or it changed); pass {flag} DATASET_DIR"
        ) from None
    return provenance_data(checkpoint, flag, splits)


HELDOUT_SEED_OFFSET = 1_000_003  # a seed stream the checkpoint's own dataset never used


def heldout_data(artifact: str | Path, samples: int = 512) -> DataChoice | None:
    """Fresh puzzles of the checkpoint's own dataset spec from a seed its data never used (in
    the ``train`` split), for calibrations that must not see training data; None when the
    checkpoint stores no dataset spec."""
    from hrm_deploy.errors import CheckpointError
    from hrm_deploy.model.checkpoint import read_checkpoint

    try:
        checkpoint = checkpoint_of(artifact)
        spec = read_checkpoint(checkpoint).extra.get("dataset")
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
