"""Sidecar manifests: ``<artifact>.manifest.json`` beside every artifact.

A manifest records how an artifact was made (stage, config, parent sha256, tool and
library versions, target, precision, unroll, I/O contract) and later its verify
report. Artifact bytes are never modified.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import sys
from pathlib import Path
from typing import Any

from hrm_deploy import __version__
from hrm_deploy.errors import ArtifactError
from hrm_deploy.io import sha256_file, write_json

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_VERSION = 1
_VERSIONED = ("torch", "onnx", "onnxruntime", "tensorrt", "tensorrt_rtx", "numpy")


def manifest_path(artifact: str | Path) -> Path:
    artifact = Path(artifact)
    return artifact.with_name(artifact.name + MANIFEST_SUFFIX)


def library_versions() -> dict[str, str]:
    """Versions of the heavy libraries *already imported* (never imports them)."""
    found = {"python": platform.python_version(), "hrm_deploy": __version__}
    for name in _VERSIONED:
        module = sys.modules.get(name)
        if module is not None:
            found[name] = str(getattr(module, "__version__", "unknown"))
    return found


def write_manifest(artifact: str | Path, *, stage: str, config: dict[str, Any],
                   parent: str | Path | None = None, **fields: Any) -> Path:
    """Write the sidecar manifest of ``artifact`` (atomically)."""
    artifact = Path(artifact)
    data: dict[str, Any] = {
        "manifest_version": MANIFEST_VERSION,
        "artifact": artifact.name,
        "sha256": sha256_file(artifact),
        "size_bytes": artifact.stat().st_size,
        "stage": stage,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tool_version": __version__,
        "versions": library_versions(),
        "config": config,
    }
    if parent is not None:
        parent = Path(parent)
        data["parent"] = {"path": str(parent), "sha256": sha256_file(parent) if parent.is_file() else None}
    data.update(fields)
    return write_json(manifest_path(artifact), data)


def read_manifest(artifact_or_manifest: str | Path) -> dict[str, Any]:
    """Read a manifest given the artifact or the manifest path itself."""
    p = Path(artifact_or_manifest)
    path = p if p.name.endswith(MANIFEST_SUFFIX) else manifest_path(p)
    if not path.is_file():
        raise ArtifactError(f"no manifest {path}; re-create the artifact with hrm-deploy so it has one")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ArtifactError(f"manifest {path} is not valid JSON; re-create the artifact") from None


def update_manifest(artifact: str | Path, **fields: Any) -> Path:
    """Merge ``fields`` into an existing manifest (e.g. a verify report)."""
    data = read_manifest(artifact)
    data.update(fields)
    return write_json(manifest_path(artifact), data)
