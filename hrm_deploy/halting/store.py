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


def stored_budgets(artifact: str) -> dict[str, Any]:
    """The budgets calibrated for ``artifact``: its manifest's, then the user cache's."""
    import json

    from hrm_deploy.manifest import manifest_path, read_manifest

    budgets: dict[str, Any] = {}
    if Path(artifact).is_file():
        cached = calibration_cache(artifact)
        if cached.is_file():
            try:
                data = json.loads(cached.read_text())
                budgets.update(data.get("budgets", {}) if isinstance(data, dict) else {})
            except (OSError, ValueError):
                pass  # a damaged cache entry is recomputed, not used
    if manifest_path(artifact).is_file():
        budgets.update(read_manifest(artifact).get("halting", {}).get("budgets", {}))
    return budgets


def stored_budget_threshold(artifact: str, rule: HaltRule) -> float | None:
    entry = stored_budgets(artifact).get(budget_key(rule))
    return None if entry is None else float(entry["threshold"])
