"""Task metrics, one set of names for verify, bench and the precision stage.

``exact_accuracy``: fraction of puzzles whose every labelled cell is right; ``token_accuracy``:
mean fraction of labelled cells right per puzzle (upstream's ``accuracy``); labels of -100 are
ignored, as upstream's loss does.
"""

from __future__ import annotations

import numpy as np

from hrm_deploy.errors import DataError


def accuracy(logits: np.ndarray, labels: np.ndarray | None) -> dict[str, float]:
    """Exact and token accuracy of ``logits`` [N, S, V] (or predictions' argmax source) against ``labels`` [N, S]."""
    if labels is None:
        raise DataError("these examples have no labels; accuracy needs a dataset folder (or a .npz with 'labels')")
    mask = labels != -100
    correct = (logits.argmax(-1) == labels) & mask
    exact = (correct.sum(-1) == mask.sum(-1)).mean()
    token = (correct.sum(-1) / np.maximum(mask.sum(-1), 1)).mean()
    return {"exact_accuracy": float(exact), "token_accuracy": float(token), "count": int(len(labels))}
