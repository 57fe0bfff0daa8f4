"""Run an activated runner over a whole set of examples, batch by batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hrm_deploy.data.examples import Examples


def infer_all(
    runner,
    examples: Examples,
    batch: int = 64,
    advance: Callable[[int], None] | None = None,
    halt: Any = None,
) -> dict[str, np.ndarray]:
    """Every output of an activated runner on all examples, batch by batch, concatenated;
    ``advance(n)`` after each batch of n examples (a :func:`hrm_deploy.progress.progress` display);
    ``halt``: a halting rule's function (:data:`hrm_deploy.contract.HaltFn`) for runners that halt."""
    parts = []
    for start in range(0, len(examples), batch):
        feeds = examples.feeds(start, start + batch)
        parts.append(runner.infer(feeds) if halt is None else runner.infer(feeds, halt=halt))
        if advance:
            advance(min(batch, len(examples) - start))
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def predict(runner, examples: Examples, batch: int = 64, advance: Callable[[int], None] | None = None) -> np.ndarray:
    """Final logits [N, S, V] of an activated runner on all examples."""
    return infer_all(runner, examples, batch, advance)["logits"].astype(np.float32)
