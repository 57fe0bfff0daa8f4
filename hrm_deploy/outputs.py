"""User-facing output files (answers, ARC submissions, reports) under the artifact rule.

An output is written with a sidecar manifest like every artifact, so a later run can tell its own
file from a user's: an existing file is replaced only when a manifest of ours names it. Outputs are
never written into a folder that is an input of the command (the dataset under evaluation, a
checkpoint's run folder), and never over an input file, through links included.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hrm_deploy.errors import ArtifactError
from hrm_deploy.io import check_output_path, staging_dir
from hrm_deploy.manifest import check_replaceable, publish_artifact

PathLike = str | os.PathLike


# What marks a training run's folder: upstream's config, or any file our trainer writes there
_RUN_MARKERS = ("all_config.yaml", "last.pt", "metrics.jsonl", ".train.lock")
_RUN_CHECKPOINT = re.compile(r"^(last\.pt|step_\d+(\.pt)?)$")  # the trainer's and upstream's names


def run_folder(checkpoint: PathLike | None) -> Path | None:
    """The folder of a training run a checkpoint lives in (a checkpoint named as a trainer names them,
    ``last.pt`` or ``step_N``, or a folder holding upstream's config or any file our trainer writes,
    whatever else it holds; or the folder itself when one was given), None for a file in a workspace."""
    if checkpoint is None:
        return None
    p = Path(checkpoint)
    if p.is_dir():
        return p
    if p.is_file() and (_RUN_CHECKPOINT.match(p.name) or any((p.parent / m).exists() for m in _RUN_MARKERS)):
        return p.parent
    return None


def check_user_output(
    out: PathLike,
    *,
    inputs: Iterable[PathLike | None] = (),
    folders: Iterable[PathLike | None] = (),
    companions: Iterable[PathLike] = (),
    flag: str = "-o",
) -> Path:
    """Refuse, in one :class:`ArtifactError` line, an output that would replace an input, land
    inside an input folder (``folders``: datasets, run folders) or replace a file hrm-deploy did not
    write (``out`` itself, or one of its ``companions`` that its manifest does not name)."""
    out = Path(out)
    real = Path(os.path.realpath(out))
    for folder in folders:
        if folder is None or not Path(folder).is_dir():
            continue
        if real.is_relative_to(Path(folder).resolve()):
            raise ArtifactError(
                f"{flag} {out} is inside {folder}, an input of this command; outputs never go into "
                "their inputs: write elsewhere (e.g. the working folder)"
            )
    check_output_path(out)
    previous = check_replaceable(out, inputs, flag=flag)
    owned = set((previous or {}).get("companions") or {})
    for extra in companions:
        extra = Path(extra)
        if os.path.lexists(extra) and extra.name not in owned:
            raise ArtifactError(
                f"{flag} {out}: {extra} exists and hrm-deploy did not write it with {out.name}; "
                "move it away or choose another output name"
            )
    return out


def publish_output(
    out: PathLike,
    content: str | bytes,
    *,
    stage: str,
    config: Mapping[str, Any] | None = None,
    companions: Mapping[PathLike, str | bytes] | None = None,
    remove: Iterable[PathLike] = (),
    **fields: Any,
) -> Path:
    """Write ``out`` (and ``companions`` beside it) with one manifest, atomically: a kill leaves
    the old files or the new ones; ``remove``: companions of the last run that no longer apply.
    Call :func:`check_user_output` first, before the work."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with staging_dir(out.parent, "stage") as stage_dir:
        staged = stage_dir / out.name
        _write(staged, content)
        pairs = []
        for i, (final, data) in enumerate((companions or {}).items()):
            tmp = stage_dir / f"companion-{i}"
            _write(tmp, data)
            pairs.append((tmp, Path(final)))
        publish_artifact(
            staged,
            out,
            stage=stage,
            config=dict(config or {}),
            companions=pairs,
            remove=[Path(r) for r in remove],
            **fields,
        )
    return out


def _write(path: Path, content: str | bytes) -> None:
    if isinstance(content, str):
        path.write_text(content)
    else:
        path.write_bytes(content)
