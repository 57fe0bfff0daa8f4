"""Where calibrated budget thresholds live: the artifact's manifest (``halting.budgets``), or, for
checkpoints and read-only artifacts, the user cache folder keyed by the file's sha256."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the rules import this module: a type-only import, no circle
    from hrm_deploy.halting.rules import HaltRule


def budget_key(rule: HaltRule) -> str:
    return f"{rule.budget:g}|min{rule.min_steps}|max{rule.max_steps or 0}"


def calibration_cache(artifact: str | Path) -> Path:
    """Where calibrations of a file without a writable manifest of ours are kept (a user's or the
    bundled checkpoint, a read-only artifact): the user cache folder, keyed by the file's sha256,
    never the package or the artifact's folder."""
    from hrm_deploy.io import cache_dir, sha256_file

    return cache_dir("halting", f"{sha256_file(artifact)}.json")


BUDGET_SCHEMA = 1


def _checksum(entry: dict[str, Any], artifact_sha256: str) -> str:
    from hrm_deploy.io import json_sha256

    return json_sha256({"artifact": artifact_sha256, **{k: v for k, v in entry.items() if k != "checksum"}})


def seal_budget(entry: dict[str, Any], artifact: str | Path) -> dict[str, Any]:
    """``entry`` with its schema and a checksum over it and the artifact's sha256: the user-cache
    copy of a calibrated threshold is used only while both still match."""
    from hrm_deploy.io import sha256_file

    body = {**{k: v for k, v in entry.items() if k != "checksum"}, "schema": BUDGET_SCHEMA}
    return {**body, "checksum": _checksum(body, sha256_file(artifact))}


def budget_problem(entry: Any, artifact_sha256: str | None = None) -> str | None:
    """Why a stored budget entry cannot be used (one phrase), or None: not an object, a threshold
    that is not a finite number, or (with ``artifact_sha256``, for the user cache) a schema or
    checksum that does not match."""
    import math

    if not isinstance(entry, dict):
        return "is not an object"
    try:
        threshold = float(entry["threshold"])
    except (KeyError, TypeError, ValueError):
        return f"has no numeric threshold (got {str(entry.get('threshold'))[:20]!r})"
    if not math.isfinite(threshold):
        return f"has a threshold that is not finite ({threshold})"
    if artifact_sha256 is not None:
        if entry.get("schema") != BUDGET_SCHEMA:
            return f"is of another schema (this version writes {BUDGET_SCHEMA})"
        if entry.get("checksum") != _checksum(entry, artifact_sha256):
            return "does not match its checksum (edited or damaged)"
    return None


def stored_budgets(artifact: str) -> dict[str, Any]:
    """The budgets calibrated for ``artifact``: its manifest's (sealed with the manifest), then the
    user cache's (each entry checked against its checksum). An entry that cannot be trusted is left
    out with a one-line warning, so the threshold is calibrated again."""
    import json
    import logging

    from hrm_deploy.io import sha256_file
    from hrm_deploy.manifest import manifest_path, read_manifest

    log = logging.getLogger(__name__)
    budgets: dict[str, Any] = {}
    found: list[tuple[str, dict[str, Any], str | None]] = []
    if Path(artifact).is_file():
        cached = calibration_cache(artifact)
        if cached.is_file():
            try:
                data = json.loads(cached.read_text())
                entries = data.get("budgets", {}) if isinstance(data, dict) else {}
            except (OSError, ValueError):
                entries = {}  # a damaged cache file is recomputed, not used
                log.warning("halting calibration cache %s is not readable JSON: calibrating again", cached)
            found.append((str(cached), entries if isinstance(entries, dict) else {}, sha256_file(artifact)))
    if manifest_path(artifact).is_file():
        found.append(
            (str(manifest_path(artifact)), read_manifest(artifact).get("halting", {}).get("budgets", {}), None)
        )
    for where, entries, sha in found:
        for key, entry in entries.items():
            problem = budget_problem(entry, sha)
            if problem:
                log.warning("halting calibration %s in %s %s: calibrating again", key, where, problem)
            else:
                budgets[key] = entry
    return budgets


def stored_budget_threshold(artifact: str, rule: HaltRule) -> float | None:
    entry = stored_budgets(artifact).get(budget_key(rule))
    return None if entry is None else float(entry["threshold"])
