"""Task metrics, one set of names for the trainer, verify, bench and the precision stage.

``exact_accuracy``: fraction of puzzles whose every labelled cell is right; ``token_accuracy``:
mean fraction of labelled cells right per puzzle (upstream's ``accuracy``); labels of
``IGNORE_LABEL_ID`` are ignored, as upstream's loss does. Curves over ACT steps are
``per_step_exact_accuracy`` / ``per_step_token_accuracy``.

:func:`row_scores` takes NumPy arrays or torch tensors alike (the trainer scores on its device
and feeds the loss from it); everything else here is NumPy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hrm_deploy.errors import DataError

IGNORE_LABEL_ID = -100  # upstream's label for cells that are not scored

# Checkpoints written before the trainer used these names (the bundled presets among them) keep
# upstream's: renamed on reading, see :func:`current_names`.
_LEGACY_NAMES = {
    "accuracy": "token_accuracy",
    "per_step_exact": "per_step_exact_accuracy",
    "per_step_token": "per_step_token_accuracy",
    "final_exact": "exact_accuracy",
}


def row_scores(predictions: Any, labels: Any) -> tuple[Any, Any]:
    """Per puzzle: solved (every labelled cell right, bool) and the fraction of labelled cells
    right (float; 0 for a puzzle without labelled cells). ``predictions`` and ``labels`` are
    [..., S] token ids that broadcast (e.g. [N, K, S] per-step predictions against [N, 1, S])."""
    mask = labels != IGNORE_LABEL_ID
    right = ((predictions == labels) & mask).sum(-1)
    counts = mask.sum(-1)
    return right == counts, right / (counts + (counts == 0))  # + (counts == 0): no division by zero


def summary(solved: np.ndarray, token_fraction: np.ndarray) -> dict[str, float]:
    """``exact_accuracy``, ``token_accuracy`` and ``count`` of per-puzzle :func:`row_scores`."""
    return {
        "exact_accuracy": float(solved.mean()),
        "token_accuracy": float(token_fraction.mean()),
        "count": int(len(solved)),
    }


def accuracy(logits: np.ndarray, labels: np.ndarray | None) -> dict[str, float]:
    """Exact and token accuracy of ``logits`` [N, S, V] against ``labels`` [N, S]."""
    if labels is None:
        raise DataError("these examples have no labels; accuracy needs a dataset folder (or a .npz with 'labels')")
    return summary(*row_scores(logits.argmax(-1), labels))


def solved_rows(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per puzzle [N]: is every labelled cell's argmax right?"""
    return row_scores(logits.argmax(-1), labels)[0]


def per_step_accuracy(solved: np.ndarray, token_fraction: np.ndarray) -> dict[str, list[float]]:
    """The curves over ACT steps of per-puzzle, per-step scores [N, K]."""
    return {
        "per_step_exact_accuracy": [float(x) for x in solved.mean(0)],
        "per_step_token_accuracy": [float(x) for x in token_fraction.mean(0)],
    }


def current_names(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``metrics`` (nested dicts too) with the trainer's old names of these metrics replaced."""
    renamed: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            renamed[key] = current_names(value)
        else:
            renamed[_LEGACY_NAMES.get(key, key)] = value
    return renamed
