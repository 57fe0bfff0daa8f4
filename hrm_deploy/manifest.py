"""Sidecar manifests: ``<artifact>.manifest.json`` beside every artifact.

A manifest records how an artifact was made (stage, config, parent sha256, tool and
library versions, target, precision, unroll, I/O contract) and later its verify
report. Artifact bytes are never modified.

An artifact and its manifest are one unit:

* :func:`publish_artifact` writes them together: the artifact is staged, hashed from the
  bytes actually written, the old manifest and verify reports are removed, the artifact is
  renamed into place and the new manifest is renamed *last*. A kill at any point leaves
  either the old pair, or an artifact without a manifest -- never a manifest describing
  another file.
* :func:`check_artifact` (and :func:`read_verified`, which also returns the bytes it
  hashed) is what every consumer calls before using an artifact: the manifest must be a
  JSON object written by hrm-deploy and its sha256 must equal the file's.
* Paths inside a manifest (``parent.path``) are stored relative to the manifest and are
  data, not instructions: :func:`resolve_parent` returns a parent only when its sha256
  matches the recorded one.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hrm_deploy import __version__
from hrm_deploy.errors import ArtifactError
from hrm_deploy.io import json_sha256, not_a_plain_file, same_file, sha256_bytes, sha256_file, write_text

MANIFEST_SUFFIX = ".manifest.json"
MANIFEST_VERSION = 1
REPORT_SUFFIXES = (".verify.json", ".verify.md")
_VERSIONED = ("torch", "onnx", "onnxruntime", "tensorrt", "tensorrt_rtx", "numpy")
_SHA = re.compile(r"^[0-9a-f]{64}$")


SEAL_KEY = "manifest_sha256"


def _check_seal(data: dict[str, Any], path: str | Path) -> None:
    """A seal that matches its fields. Every manifest hrm-deploy ever released writes is sealed, so
    one without a seal (whatever ``tool_version`` it claims) was edited, and is refused like one."""
    if SEAL_KEY not in data:
        raise ArtifactError(
            f"manifest {path} has no seal ({SEAL_KEY}), yet hrm-deploy seals every manifest it writes: it was "
            "edited, so what it says about the artifact cannot be trusted; re-create the artifact"
        )
    if _sealed(data)[SEAL_KEY] != data[SEAL_KEY]:
        raise ArtifactError(
            f"manifest {path} was edited after hrm-deploy wrote it (its fields no longer match their "
            "seal): what it says about the artifact cannot be trusted; re-create the artifact"
        )


def _sealed(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with its seal: the sha256 of its canonical JSON without the seal. Only hrm-deploy's
    writers seal, so a field edited by hand (a precision, a step count, a halting threshold) no
    longer matches and the manifest is refused instead of trusted."""
    body = {k: v for k, v in data.items() if k != SEAL_KEY}
    return {**body, SEAL_KEY: json_sha256(body)}


def manifest_text(data: dict[str, Any]) -> str:
    """The sealed JSON text of a manifest, as every writer of manifests stores it."""
    return json.dumps(_sealed(data), indent=2, default=str) + "\n"


def manifest_path(artifact: str | Path) -> Path:
    artifact = Path(artifact)
    return artifact.with_name(artifact.name + MANIFEST_SUFFIX)


def report_paths(artifact: str | Path) -> list[Path]:
    """The verify reports kept beside ``artifact`` (``.verify.json``/``.verify.md``)."""
    artifact = Path(artifact)
    return [artifact.with_name(artifact.name + s) for s in REPORT_SUFFIXES]


def library_versions() -> dict[str, str]:
    """Versions of the heavy libraries *already imported* (never imports them)."""
    found = {"python": platform.python_version(), "hrm_deploy": __version__}
    for name in _VERSIONED:
        module = sys.modules.get(name)
        if module is not None:
            found[name] = str(getattr(module, "__version__", "unknown"))
    return found


def _relative(path: Path, base: Path) -> str:
    """``path`` relative to the folder ``base`` (a manifest's folder), as stored in manifests. A file
    in the Hugging Face cache keeps its snapshot path (a link to a content-named blob): the snapshot
    folder, beside ``all_config.yaml``, is where the checkpoint is read from and says which commit."""
    from hrm_deploy.sources import hub_name

    target = Path(path).parent.resolve() / Path(path).name if hub_name(path) else Path(path).resolve()
    try:
        return os.path.relpath(target, base.resolve())
    except ValueError:  # another drive (Windows)
        return str(target)


def manifest_data(
    artifact: str | Path,
    *,
    stage: str,
    config: dict[str, Any],
    sha256: str | None = None,
    size_bytes: int | None = None,
    parent: str | Path | None = None,
    parent_sha256: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """The manifest dict of ``artifact`` (final path). ``sha256``/``size_bytes`` default to
    hashing the file now; ``parent`` is stored relative to the manifest's folder."""
    artifact = Path(artifact)
    data: dict[str, Any] = {
        "manifest_version": MANIFEST_VERSION,
        "artifact": artifact.name,
        "sha256": sha256 or sha256_file(artifact),
        "size_bytes": size_bytes if size_bytes is not None else artifact.stat().st_size,
        "stage": stage,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tool_version": __version__,
        "versions": library_versions(),
        "config": config,
    }
    if parent is not None:
        parent = Path(parent)
        digest = parent_sha256 or (sha256_file(parent) if parent.is_file() else None)
        data["parent"] = {"path": _relative(parent, artifact.parent), "sha256": digest}
    data.update(fields)
    return data


def mark_reports_stale(artifact: str | Path) -> None:
    """Remove the verify reports beside ``artifact``: they describe the bytes being replaced."""
    for report in report_paths(artifact):
        try:
            report.unlink()
        except FileNotFoundError:
            pass


def write_manifest(
    artifact: str | Path, *, stage: str, config: dict[str, Any], parent: str | Path | None = None, **fields: Any
) -> Path:
    """Write the sidecar manifest of an artifact already in place (atomically), hashing it now.

    Prefer :func:`publish_artifact`, which writes artifact and manifest as one unit and hashes
    the bytes it staged."""
    artifact = Path(artifact)
    data = manifest_data(artifact, stage=stage, config=config, parent=parent, **fields)
    mark_reports_stale(artifact)
    return write_text(manifest_path(artifact), manifest_text(data))


def publish_artifact(
    staged: str | Path,
    artifact: str | Path,
    *,
    stage: str,
    config: dict[str, Any],
    parent: str | Path | None = None,
    parent_sha256: str | None = None,
    companions: Iterable[tuple[Path, Path]] = (),
    sidecars: Iterable[tuple[Path, Path]] = (),
    remove: Iterable[Path] = (),
    **fields: Any,
) -> Path:
    """Move a staged artifact into place together with its manifest; returns the manifest path.

    ``staged`` must be on the target's file system (a :func:`hrm_deploy.io.staging_dir` in the
    target folder). Its sha256 is computed from the staged bytes, i.e. exactly what will be
    at ``artifact``. Order: write the manifest into staging, remove the old manifest and verify
    reports, rename ``companions`` (staged, final) such as external ``.data`` files (their sha256
    is recorded and checked with the artifact) and ``sidecars`` (informational files such as an
    engine's ``layers.json``: renamed with it, not checked), remove ``remove`` (an old companion
    that no longer applies), rename the artifact, rename the manifest last."""
    from hrm_deploy.io import check_output_path

    staged, artifact = Path(staged), Path(artifact)
    check_output_path(artifact)
    check_output_path(manifest_path(artifact))
    # The last gate before anything is replaced (every builder ends here): never over the
    # parent it was made from, never over a file that is not one of our artifacts.
    replaced = check_replaceable(artifact, [parent] if parent is not None else [])
    owned = _owned_names(replaced)
    remove = [r for r in remove if Path(r).name in owned]  # only files the old manifest names
    companions = list(companions)
    if companions:
        fields.setdefault("companions", {final.name: sha256_file(src) for src, final in companions})
    data = manifest_data(
        artifact,
        stage=stage,
        config=config,
        sha256=sha256_file(staged),
        size_bytes=staged.stat().st_size,
        parent=parent,
        parent_sha256=parent_sha256,
        **fields,
    )
    staged_manifest = staged.with_name(staged.name + ".manifest.staged")
    staged_manifest.write_text(manifest_text(data))
    final_manifest = manifest_path(artifact)
    try:
        final_manifest.unlink()
    except FileNotFoundError:
        pass
    mark_reports_stale(artifact)
    for src, final in [*companions, *sidecars]:
        os.replace(src, final)
    for old in remove:
        try:
            Path(old).unlink()
        except FileNotFoundError:
            pass
    os.replace(staged, artifact)
    _hook("between-artifact-and-manifest")
    os.replace(staged_manifest, final_manifest)
    return final_manifest


def _owned_names(manifest: dict[str, Any] | None) -> set[str]:
    """Names of the files beside an artifact that its manifest says we wrote (companions, layers)."""
    if not manifest:
        return set()
    names = {str(n) for n in (manifest.get("companions") or {})}
    if isinstance(manifest.get("layers_json"), str):
        names.add(manifest["layers_json"])
    return {n for n in names if Path(n).name == n}


def check_replaceable(
    out: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = (), *, flag: str = "-o"
) -> dict[str, Any] | None:
    """Refuse an output that would destroy something hrm-deploy did not write; returns the
    manifest of the artifact it replaces (None when ``out`` does not exist yet).

    Refused, each with one :class:`ArtifactError` line: ``out`` (or its manifest or ``.data``
    companion) is, or resolves to through links, one of ``inputs``; ``out`` is a folder, a
    symlink, a FIFO or device; ``out`` exists but has no manifest of ours naming it (a user's
    file). Use :func:`output_path` first to map a folder to ``<folder>/<default name>``."""
    out = Path(out)
    for src in inputs:
        if src is None or not os.path.lexists(src):
            continue
        for candidate in (out, manifest_path(out), out.with_name(out.name + ".data")):
            if os.path.lexists(candidate) and same_file(candidate, src):
                raise ArtifactError(
                    f"{flag} {out} is (or resolves to) the input {src}; an output never replaces its "
                    "input: choose another output path"
                )
    if not os.path.lexists(out):
        beside = manifest_path(out)
        if os.path.lexists(beside):  # publishing removes it: only if it is one of our manifests
            try:
                read_manifest(out)
            except ArtifactError:
                raise ArtifactError(
                    f"{flag} {out}: {beside.name} exists and is not an hrm-deploy manifest; hrm-deploy replaces "
                    "only its own files: move it away or choose another output path"
                ) from None
        return None
    if out.is_symlink():
        raise ArtifactError(
            f"{flag} {out} is a symbolic link to {os.path.realpath(out)}; hrm-deploy replaces only its own "
            "artifacts: give the real path or a new file name"
        )
    if out.is_dir():
        raise ArtifactError(f"{flag} {out} is a folder; give a file path (e.g. {out}/model{out.suffix or '.onnx'})")
    if not out.is_file():
        raise ArtifactError(f"{flag} {out} is not a regular file (a FIFO or device?); choose another output path")
    reason = "it has no manifest"
    if manifest_path(out).is_file():
        try:
            return read_manifest(out)  # ours (a copy renamed with its manifest included)
        except ArtifactError as exc:
            reason = f"its manifest is not ours ({exc})"
    raise ArtifactError(
        f"{flag} {out} exists and is not an hrm-deploy artifact ({reason}); hrm-deploy replaces only "
        "its own artifacts: move it away or choose another output path"
    )


def output_path(out: str | os.PathLike, default_name: str | None, *, flag: str = "-o", folder: bool = False) -> Path:
    """Where ``-o`` writes, by one rule for every command that takes it: ``out`` ending with a
    separator (``-o NEWDIR/``) or naming an existing folder is a folder, never a file of that name.
    A command whose output is a folder (``folder``: datasets, runs, reports, repositories) writes
    that folder; one whose output is a file writes ``<out>/<default_name>`` (the folder made when
    missing), or, without a default name, refuses in one line. A file where a folder is meant is
    one line too."""
    text = os.fspath(out)
    slash = text.endswith((os.sep, "/"))
    out = Path(text)
    if folder:
        if os.path.lexists(out) and not out.is_dir():
            raise ArtifactError(f"{flag} {text}: {out} is a file, not a folder; choose another path")
        return out
    if slash and not out.is_dir():
        if default_name is None:
            raise ArtifactError(f"{flag} {out}{os.sep} names a folder; give the output's file name inside it")
        if os.path.lexists(out):
            raise ArtifactError(f"{flag} {out}{os.sep} names a folder but {out} is a file; choose another path")
        out.mkdir(parents=True)
    if out.is_dir():
        if default_name is None:
            raise ArtifactError(f"{flag} {out} is a folder; give the output's file name inside it")
        return out / default_name
    return out


def _hook(point: str) -> None:
    """Test hook: ``HRM_DEPLOY_TEST_KILL_AT=<point>`` kills this process with SIGKILL at
    ``point`` so tests can reproduce a kill between two steps of a unit write."""
    if os.environ.get("HRM_DEPLOY_TEST_KILL_AT") == point:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def read_manifest(artifact_or_manifest: str | Path) -> dict[str, Any]:
    """Read a manifest given the artifact or the manifest path itself; it must be a JSON
    object written by hrm-deploy (``manifest_version``, ``artifact``, ``sha256``)."""
    p = Path(artifact_or_manifest)
    path = p if p.name.endswith(MANIFEST_SUFFIX) else manifest_path(p)
    try:
        raw = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise ArtifactError(f"no manifest {path}; re-create the artifact with hrm-deploy so it has one") from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise ArtifactError(f"manifest {path} is not valid JSON; re-create the artifact") from None
    return validate_manifest(data, path)


def validate_manifest(data: Any, path: str | Path) -> dict[str, Any]:
    """``data`` if it has the shape of an hrm-deploy manifest, else one :class:`ArtifactError`."""
    if not isinstance(data, dict):
        raise ArtifactError(
            f"manifest {path} holds a JSON {type(data).__name__}, not an object; re-create the artifact with hrm-deploy"
        )
    if "manifest_version" not in data or "sha256" not in data or "artifact" not in data:
        raise ArtifactError(
            f"{path} is not an hrm-deploy manifest (no manifest_version/artifact/sha256); "
            "re-create the artifact with hrm-deploy"
        )
    if data["manifest_version"] != MANIFEST_VERSION:
        raise ArtifactError(
            f"manifest {path} has version {data['manifest_version']!r}; this hrm-deploy reads "
            f"version {MANIFEST_VERSION}: re-create the artifact or upgrade hrm-deploy"
        )
    if not isinstance(data["sha256"], str) or not _SHA.match(data["sha256"]):
        raise ArtifactError(
            f"manifest {path} has no valid sha256 (got {str(data['sha256'])[:70]!r}); "
            "it was edited or damaged: re-create the artifact"
        )
    _check_seal(data, path)
    return data


def _verify_digest(artifact: Path, manifest: dict[str, Any], digest: str, size: int) -> None:
    if digest != manifest["sha256"]:
        raise ArtifactError(
            f"{artifact} does not match its manifest (sha256 {digest[:12]}... on disk, "
            f"{manifest['sha256'][:12]}... recorded, {size} vs {manifest.get('size_bytes')} bytes): "
            "the file was changed or replaced after it was made; re-create it"
        )
    for name, want in (manifest.get("companions") or {}).items():
        companion = artifact.with_name(str(name))
        if Path(str(name)).name != str(name) or not companion.is_file() or sha256_file(companion) != want:
            raise ArtifactError(
                f"{companion} (part of {artifact.name}) is missing or does not match the manifest; "
                "re-create the artifact"
            )


def check_artifact(artifact: str | Path, *, require_manifest: bool = False) -> dict[str, Any] | None:
    """Check ``artifact`` against its manifest before use; returns the manifest.

    Raises one :class:`ArtifactError` line when the manifest is not a JSON object / not ours,
    names another file, or its sha256 differs from the file's (an edited or zeroed sha256
    is caught). Without a manifest: ``None``, or an error when ``require_manifest``."""
    artifact = Path(artifact)
    if not artifact.is_file():
        raise path_error(artifact)
    if not manifest_path(artifact).exists():
        if require_manifest:
            read_manifest(artifact)  # raises the "no manifest" line
        return None
    manifest = read_manifest(artifact)
    _verify_digest(artifact, manifest, sha256_file(artifact), artifact.stat().st_size)
    return manifest


def path_error(artifact: Path) -> ArtifactError:
    """The line for an artifact path that is not a regular file: what it is instead (a FIFO, a
    device, a link to nowhere, a folder, nothing)."""
    odd = not_a_plain_file(artifact)
    if odd is not None:
        return ArtifactError(
            f"{artifact} is {odd}, not an artifact file; give the graph, engine or checkpoint file itself"
        )
    if artifact.is_dir():
        return ArtifactError(f"{artifact} is a folder, not an artifact file; give the graph or engine file in it")
    return ArtifactError(f"{artifact} does not exist; check the path")


def read_verified(artifact: str | Path, *, require_manifest: bool = False) -> tuple[bytes, dict[str, Any] | None]:
    """The artifact's bytes, read once, and its manifest, after checking that the sha256 of
    exactly these bytes equals the manifest's. Use the returned bytes (not the path) so a
    file replaced meanwhile cannot slip in."""
    artifact = Path(artifact)
    try:
        data = artifact.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        raise path_error(artifact) from None
    if not manifest_path(artifact).exists():
        if require_manifest:
            read_manifest(artifact)
        return data, None
    manifest = read_manifest(artifact)
    _verify_digest(artifact, manifest, sha256_bytes(data), len(data))
    return data, manifest


def resolve_parent(artifact: str | Path, manifest: dict[str, Any]) -> Path | None:
    """The parent file a manifest names, only if it exists and its sha256 matches the record.

    Relative paths are taken from the manifest's folder (older manifests stored them relative
    to the working directory; that is tried second). Raises :class:`ArtifactError` when the
    parent exists but its sha256 differs or none was recorded."""
    parent = manifest.get("parent")
    if not isinstance(parent, dict) or not isinstance(parent.get("path"), str) or not parent["path"]:
        return None
    recorded = Path(parent["path"])
    candidates = [recorded] if recorded.is_absolute() else [Path(artifact).parent / recorded, recorded]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        return None
    want = parent.get("sha256")
    if not isinstance(want, str) or not _SHA.match(want) or sha256_file(found) != want:
        raise ArtifactError(
            f"{found} changed since {Path(artifact).name} was made from it (sha256 differs or is "
            "not recorded); pass the original explicitly, or re-create the artifact"
        )
    return found


def update_manifest(artifact: str | Path, *, expect_sha256: str | None = None, **fields: Any) -> Path:
    """Merge ``fields`` into an existing manifest (e.g. a verify report). With
    ``expect_sha256``, only if the manifest still describes those bytes (a verify result is
    never recorded in the manifest of an artifact re-exported meanwhile)."""
    data = read_manifest(artifact)
    if expect_sha256 is not None and data["sha256"] != expect_sha256:
        raise ArtifactError(f"{artifact} was replaced meanwhile; its new manifest was left as it is: run again")
    data.update(fields)
    return write_text(manifest_path(artifact), manifest_text(data))


def refuse_companion(path: str | os.PathLike) -> None:
    """One :class:`ArtifactError` line when ``path`` is a companion of an artifact of ours (a ``.pt2``'s
    ``.program`` load fallback, an ONNX graph's external ``.data``): it names the artifact to give instead,
    where reading the file on its own would call it truncated or damaged."""
    path = Path(path)
    parts = path.name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        owner = path.with_name(".".join(parts[:cut]))
        if not manifest_path(owner).is_file():
            continue
        try:
            data = json.loads(manifest_path(owner).read_text())
        except (OSError, ValueError):
            continue
        named = dict(data.get("companions") or {}) if isinstance(data, dict) else {}
        if path.name in named or (isinstance(data, dict) and data.get("load_fallback") == path.name):
            raise ArtifactError(
                f"{path} is a companion file of {owner} (kept beside it and read with it); give {owner} itself"
            )
