"""Where a checkpoint or dataset comes from: a path, a run folder, or ``hf:ORG/NAME[@REVISION][/PATH]``.

Every command resolves its checkpoint and dataset arguments here, before any work starts, so the
stages below always get a local file (a checkpoint) or folder (a dataset):

- a file: as given;
- a run folder (upstream's ``step_N`` files + ``all_config.yaml``): its newest ``step_N``; a folder
  with one weights file named ``checkpoint`` (the layout of the published HRM repositories) or one
  ``.pt`` (our trainer): that file;
- ``hf:ORG/NAME[@REVISION][/PATH]``: the repository snapshot in the Hugging Face cache, downloaded by
  ``huggingface_hub`` when it is not there (the ``hub`` extra). ``HF_HOME``/``HF_HUB_CACHE``,
  ``HF_HUB_OFFLINE`` and the usual tokens (``HF_TOKEN``, ``hf auth login``) apply. ``PATH`` picks a
  file or folder inside the snapshot.

A file inside the cache knows where it came from: its path is
``<cache>/models--ORG--NAME/snapshots/<commit>/<file>``; :func:`hub_origin` reads the repository,
commit and the refs naming it from there, so a manifest can record exactly which published weights an
artifact was made from without any state carried between stages.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hrm_deploy.errors import CheckpointError, DependencyError, HRMDeployError, install_hint

log = logging.getLogger(__name__)

PREFIX = "hf:"
# A run folder's weights: upstream's step_N (newest wins); the published repos' single "checkpoint".
STEP_FILE = re.compile(r"step_(\d+)")
PUBLISHED_NAME = "checkpoint"
_REPO_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_SPEC = re.compile(rf"hf:(?P<repo>{_REPO_PART}/{_REPO_PART})(?:@(?P<rev>[^/]+))?(?:/(?P<path>.+))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")


class SourceError(HRMDeployError):
    """A Hub source cannot be resolved (not cached offline, no such repo or revision, no such file)."""


@dataclass(frozen=True)
class HubRef:
    """A parsed ``hf:ORG/NAME[@REVISION][/PATH]``."""

    repo_id: str
    revision: str | None = None
    path: str | None = None
    repo_type: str = "model"  # or "dataset"

    def __str__(self) -> str:
        return (
            PREFIX
            + self.repo_id
            + (f"@{self.revision}" if self.revision else "")
            + (f"/{self.path}" if self.path else "")
        )

    def cache_folder(self) -> Path:
        """This repository's folder in the Hub cache (``models--ORG--NAME`` or ``datasets--...``)."""
        return hub_cache() / f"{self.repo_type}s--{self.repo_id.replace('/', '--')}"


def is_hub(spec: str | os.PathLike | None) -> bool:
    """Whether ``spec`` names a Hub repository (``hf:...``)."""
    return spec is not None and str(spec).startswith(PREFIX)


def parse_hub(spec: str | os.PathLike, repo_type: str = "model") -> HubRef:
    """``hf:ORG/NAME[@REVISION][/PATH]`` -> :class:`HubRef`; one line naming the form otherwise."""
    text = str(spec)
    match = _SPEC.fullmatch(text)
    if match is None or ".." in text.split("/"):
        raise SourceError(f"{text!r} is not a Hub source; write hf:ORG/NAME, hf:ORG/NAME@REVISION or hf:ORG/NAME/PATH")
    return HubRef(match["repo"], match["rev"], match["path"], repo_type)


def hub_cache() -> Path:
    """huggingface_hub's cache folder, read from the environment now (``HF_HUB_CACHE``, else
    ``HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` or ``~/.cache/huggingface/hub``)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "huggingface" / "hub"


def offline() -> bool:
    """``HF_HUB_OFFLINE`` set to a true value (read at each call, not at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _download_hint(ref: HubRef) -> str:
    kind = " --repo-type dataset" if ref.repo_type == "dataset" else ""
    rev = f" --revision {ref.revision}" if ref.revision else ""
    return (
        f"on a connected machine run `hf download {ref.repo_id}{kind}{rev}` (older huggingface_hub: "
        f"huggingface-cli download), then copy its cache folder {ref.cache_folder().name} into {hub_cache()} "
        "(or set HF_HOME to the copied cache), or pass a local folder instead"
    )


def _cached_refs(ref: HubRef) -> dict[str, str]:
    """``{ref name: commit}`` of what the cache holds for this repository."""
    refs = ref.cache_folder() / "refs"
    found = {}
    if refs.is_dir():
        for file in refs.rglob("*"):
            if file.is_file():
                found[str(file.relative_to(refs))] = file.read_text().strip()
    return found


def _not_available(ref: HubRef) -> SourceError:
    """The one line for a repository or revision missing from the cache with no Hub to ask."""
    why = "HF_HUB_OFFLINE is set" if offline() else "the Hub could not be reached"
    cached = _cached_refs(ref)
    if ref.cache_folder().is_dir() and ref.revision:
        known = ", ".join(f"{k} ({v[:7]})" for k, v in sorted(cached.items())) or "no named revision"
        return SourceError(
            f"{ref}: revision {ref.revision} of {ref.repo_id} is not in the Hugging Face cache {hub_cache()} "
            f"(it holds {known}) and {why}; give a cached revision, or {_download_hint(ref)}"
        )
    return SourceError(
        f"{ref}: {ref.repo_id} is not in the Hugging Face cache {hub_cache()} and {why}; {_download_hint(ref)}"
    )


def fetch(ref: HubRef) -> Path:
    """The local snapshot folder of ``ref`` (downloaded into the cache if needed, with
    huggingface_hub's own progress bars and their ETA), before any other work."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            GatedRepoError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError:
        raise DependencyError(
            f"{ref} is a Hugging Face Hub source, which needs the Python package huggingface_hub; "
            f"install it with: {install_hint('hub')} (or pass a local path)"
        ) from None
    local_only = offline()
    if local_only and not (
        ref.revision is None or ref.revision in _cached_refs(ref) or _COMMIT.fullmatch(ref.revision)
    ):
        raise _not_available(ref)
    try:
        folder = snapshot_download(
            ref.repo_id,
            repo_type=ref.repo_type,
            revision=ref.revision,
            cache_dir=str(hub_cache()),
            local_files_only=local_only,
            endpoint=os.environ.get("HF_ENDPOINT") or None,  # read now, like the cache and offline flag
        )
    except GatedRepoError:
        raise SourceError(
            f"{ref}: {ref.repo_id} is gated; accept its terms on huggingface.co and log in (`hf auth login` or HF_TOKEN)"
        ) from None
    except RepositoryNotFoundError:
        raise SourceError(
            f"{ref}: no {ref.repo_type} repository {ref.repo_id} on the Hugging Face Hub (or it is private: "
            "log in with `hf auth login` or set HF_TOKEN); check the name"
        ) from None
    except RevisionNotFoundError:
        raise SourceError(
            f"{ref}: {ref.repo_id} has no revision {ref.revision}; give a branch, tag or commit that exists (default main)"
        ) from None
    except LocalEntryNotFoundError:
        raise _not_available(ref) from None
    except (OSError, ValueError) as exc:  # connection errors and HTTP errors are OSError subclasses
        if not _cached_refs(ref) or local_only:
            raise _not_available(ref) from None
        raise SourceError(f"{ref}: {str(exc).strip().splitlines()[0][:200]}") from None
    log.info("%s -> %s", ref, folder)
    return Path(str(folder))


def _inside(ref: HubRef, snapshot: Path) -> Path:
    if not ref.path:
        return snapshot
    target = snapshot / ref.path
    if not (target.is_file() or target.is_dir()):
        names = sorted(p.name for p in snapshot.iterdir())[:8]
        raise SourceError(f"{ref}: {ref.repo_id} has no {ref.path} (it holds {', '.join(names) or 'nothing'})")
    return target


def resolve_checkpoint_path(path: str | os.PathLike) -> Path:
    """A file as given, or in a folder the upstream ``step_N`` with the highest N, else the single
    file named ``checkpoint`` (the published repositories) or the single ``*.pt`` (ours)."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint {p} does not exist; pass the path of a step_N or .pt file")
    if p.is_file():
        return p
    if not p.is_dir():  # a FIFO would block the reader, /dev/zero never ends
        raise CheckpointError(f"{p} is not a regular file or folder (a FIFO or device?); pass a step_N or .pt file")
    steps = [(int(m.group(1)), c) for c in p.iterdir() if (m := STEP_FILE.fullmatch(c.name)) and c.is_file()]
    if steps:
        return max(steps)[1]
    if (p / PUBLISHED_NAME).is_file():
        return p / PUBLISHED_NAME
    ours = sorted(p.glob("*.pt"))
    if len(ours) == 1:
        return ours[0]
    raise CheckpointError(f"folder {p} holds no step_N file and {len(ours)} .pt files; pass the checkpoint file itself")


def resolve_checkpoint(spec: str | os.PathLike) -> Path:
    """The checkpoint file ``spec`` names: a file, a run folder's newest step file, or a Hub source
    (fetched into the cache first). Call it at the entry point, before any work."""
    if is_hub(spec):
        ref = parse_hub(spec)
        return resolve_checkpoint_path(_inside(ref, fetch(ref)))
    return resolve_checkpoint_path(spec)


def resolve_artifact(spec: str | os.PathLike | None) -> Path | None:
    """An artifact argument, before any work: a Hub source or a run folder becomes its checkpoint
    file (:func:`resolve_checkpoint`); any other path (a checkpoint file, an ONNX graph, an engine)
    is returned as given; ``None`` (the command's default) passes through."""
    if spec is None:
        return None
    return resolve_checkpoint(spec) if is_hub(spec) or Path(spec).is_dir() else Path(spec)


def resolve_optional_checkpoint(spec: str | os.PathLike | None) -> Path | None:
    """:func:`resolve_checkpoint`, passing ``None`` (a command's "from the manifests" default) through."""
    return None if spec is None else resolve_checkpoint(spec)


def resolve_data(spec: str | os.PathLike) -> Path:
    """The local folder (or file) a dataset argument names: a Hub dataset's snapshot (or ``/PATH`` in
    it), else the path as given (checked by the dataset reader)."""
    if is_hub(spec):
        ref = parse_hub(spec, repo_type="dataset")
        return _inside(ref, fetch(ref))
    return Path(spec)


# ------------------------------------------------------------------------------ provenance
_ORIGIN_CACHE: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """sha256 of ``path``, computed once per (path, size, mtime) in this process."""
    from hrm_deploy.io import sha256_file

    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _ORIGIN_CACHE:
        _ORIGIN_CACHE[key] = sha256_file(path)
    return _ORIGIN_CACHE[key]


def _cache_location(path: str | os.PathLike) -> tuple[Path, str, str, str, Path] | None:
    """``(repo folder, repo type, repo id, commit, snapshot folder)`` of a path inside the Hub
    cache layout (``<kind>s--ORG--NAME/snapshots/<commit>/...``), else ``None``. Reads nothing."""
    parts = Path(os.path.abspath(path)).parts  # ".." folded, symlinks (snapshot -> blob) kept
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots" and _COMMIT.fullmatch(parts[i + 1]) and "--" in parts[i - 1]:
            kind, _, name = parts[i - 1].partition("--")
            if kind not in ("models", "datasets"):
                return None
            return Path(*parts[:i]), kind[:-1], name.replace("--", "/", 1), parts[i + 1], Path(*parts[: i + 2])
    return None


def hub_name(path: str | os.PathLike) -> str | None:
    """The repository name (``NAME`` of ``ORG/NAME``) of a path in the Hub cache, else ``None``: a
    readable default for artifact names (the published weights file is just ``checkpoint``)."""
    found = _cache_location(path)
    return found[2].split("/")[-1] if found else None


def hub_origin(path: str | os.PathLike | None, files: tuple[str, ...] = ("all_config.yaml",)) -> dict[str, Any] | None:
    """Where a file in the Hugging Face cache came from: ``{"repo", "repo_type", "commit",
    "revision", "refs", "files": {name: sha256}}`` for ``path`` and the named ``files`` beside
    it; ``None`` for a path outside the cache layout."""
    found = _cache_location(path) if path is not None else None
    if found is None or path is None:
        return None
    repo_root, kind, repo_id, commit, snapshot = found
    refs_dir = repo_root / "refs"
    refs = (
        sorted(
            str(f.relative_to(refs_dir)) for f in refs_dir.rglob("*") if f.is_file() and f.read_text().strip() == commit
        )
        if refs_dir.is_dir()
        else []
    )
    p = Path(os.path.abspath(path))
    shown = [p] if p.is_file() else []
    shown += [p.parent / f for f in files if (p.parent / f).is_file() and p.parent / f != p]
    for f in shown:  # a snapshot's files are links into the repository's own blobs, never elsewhere
        real = f.resolve()
        if not real.is_relative_to(repo_root.resolve()):
            raise SourceError(
                f"{f} resolves to {real}, outside the Hub cache's folder of {repo_id}: it is not that "
                f"repository's file; download it again (hf download {repo_id}) or pass a file outside the cache"
            )
    return {
        "repo": repo_id,
        "repo_type": kind,
        "commit": commit,
        "revision": "main" if "main" in refs else (refs[0] if refs else commit),
        "refs": refs,
        "files": {str(f.relative_to(snapshot)): file_sha256(f) for f in shown},
    }


def describe_data(path: str | os.PathLike | None) -> dict[str, Any] | None:
    """A dataset argument's origin for a report (the Hub record when it came from the cache)."""
    return hub_origin(path, files=()) if path is not None else None


__all__ = [
    "HubRef",
    "SourceError",
    "describe_data",
    "fetch",
    "file_sha256",
    "hub_cache",
    "hub_name",
    "hub_origin",
    "is_hub",
    "offline",
    "parse_hub",
    "resolve_artifact",
    "resolve_checkpoint",
    "resolve_checkpoint_path",
    "resolve_data",
    "resolve_optional_checkpoint",
]
