"""What an artifact is, from its file name, and which checkpoint it came from.

The suffixes come from the backend table (:data:`hrm_deploy.registry.BACKENDS`), plain data in
the base, so that every room can tell a checkpoint from an ONNX graph or an engine, and follow an
artifact back to its checkpoint, without importing a backend.
"""

from __future__ import annotations

from pathlib import Path

from hrm_deploy.errors import ArtifactError
from hrm_deploy.manifest import check_artifact, manifest_path, path_error, resolve_parent
from hrm_deploy.registry import CHECKPOINT_RUNNER, runner_name

__all__ = [
    "check_artifact_file",
    "find_reference",
    "is_checkpoint",
    "recorded_data",
    "recorded_overrides",
    "runner_name",
]
# The longest real chain (checkpoint -> ONNX -> precision ONNX -> engine) has 3 links; the bound
# stops a loop of manifests.
MAX_PARENT_LINKS = 8


def is_checkpoint(artifact: str | Path) -> bool:
    return runner_name(artifact) == CHECKPOINT_RUNNER


def check_artifact_file(artifact: str | Path) -> None:
    """One line, before any work, when ``artifact`` is neither a file nor a checkpoint (folder): a
    FIFO, a device or a link to nowhere is named as what it is (:func:`hrm_deploy.manifest.path_error`)."""
    path = Path(artifact)
    if not path.is_file() and not is_checkpoint(path):
        raise path_error(path)


def _to_checkpoint(artifact: Path) -> tuple[Path, dict]:
    """The checkpoint an artifact came from and the manifest that names it (the export's)."""
    current = Path(artifact)
    check_artifact_file(current)  # a FIFO or a device is named as one first
    for _ in range(MAX_PARENT_LINKS):
        if not manifest_path(current).is_file():
            break
        manifest = check_artifact(current) or {}
        parent = resolve_parent(current, manifest)
        if parent is None:
            break
        current = parent
        if is_checkpoint(current):
            return current, manifest
    raise ArtifactError(f"cannot tell which checkpoint {artifact} came from; pass it with --against CKPT")


def find_reference(artifact: Path) -> Path:
    """The checkpoint an artifact came from, following the manifests' parent links.

    Every link is checked: an intermediate artifact must match its own manifest and each
    parent's sha256 must match the record (see :func:`hrm_deploy.manifest.resolve_parent`),
    so a manifest edited to name another file is refused, not followed."""
    return _to_checkpoint(artifact)[0]


def recorded_data(artifact: str | Path) -> tuple[Path, dict | None]:
    """The checkpoint an artifact came from (checked as :func:`find_reference` checks it) and what
    its export's manifest recorded of the data the checkpoint was trained on
    (:meth:`~hrm_deploy.model.checkpoint.CheckpointContents.data_record`; None where an older
    export did not record it)."""
    checkpoint, manifest = _to_checkpoint(Path(artifact))
    source = manifest.get("source")
    data = source.get("data") if isinstance(source, dict) else None
    return checkpoint, data if isinstance(data, dict) else None


def recorded_overrides(artifact: str | Path) -> dict:
    """The checkpoint-config overrides an artifact was exported with (``export --num-heads 8``
    filling a field its checkpoint lacked), read from its manifests' chain; {} when none. The
    reference model must be loaded with exactly these to be the same model."""
    current = Path(artifact)
    for _ in range(MAX_PARENT_LINKS):
        if is_checkpoint(current) or not manifest_path(current).is_file():
            break
        manifest = check_artifact(current) or {}
        found = manifest.get("checkpoint_overrides")
        if isinstance(found, dict) and found:
            return dict(found)
        parent = resolve_parent(current, manifest)
        if parent is None:
            break
        current = parent
    return {}
