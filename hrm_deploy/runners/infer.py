"""Run an activated runner over a whole set of examples, batch by batch."""

from __future__ import annotations

import numpy as np

from hrm_deploy.data.examples import Examples


def infer_all(runner, examples: Examples, batch: int = 64) -> dict[str, np.ndarray]:
    """Every output of an activated runner on all examples, batch by batch, concatenated."""
    parts = [runner.infer(examples.feeds(start, start + batch)) for start in range(0, len(examples), batch)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def predict(runner, examples: Examples, batch: int = 64) -> np.ndarray:
    """Final logits [N, S, V] of an activated runner on all examples."""
    return infer_all(runner, examples, batch)["logits"].astype(np.float32)
