"""Run an activated runner over a whole set of examples, batch by batch."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hrm_deploy.data.examples import Examples


def infer_all(
    runner, examples: Examples, batch: int = 64, advance: Callable[[int], None] | None = None
) -> dict[str, np.ndarray]:
    """Every output of an activated runner on all examples, batch by batch, concatenated;
    ``advance(n)`` after each batch of n examples (a :func:`hrm_deploy.progress.progress` display)."""
    parts = []
    for start in range(0, len(examples), batch):
        parts.append(runner.infer(examples.feeds(start, start + batch)))
        if advance:
            advance(min(batch, len(examples) - start))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def predict(runner, examples: Examples, batch: int = 64, advance: Callable[[int], None] | None = None) -> np.ndarray:
    """Final logits [N, S, V] of an activated runner on all examples."""
    return infer_all(runner, examples, batch, advance)["logits"].astype(np.float32)
