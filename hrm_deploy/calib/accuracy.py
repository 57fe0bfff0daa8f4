"""Exact and token accuracy of a runner's answers on labelled examples."""

from __future__ import annotations

import numpy as np

from hrm_deploy.calib.data import Examples
from hrm_deploy.errors import DataError
from hrm_deploy.export.metadata import graph_metadata  # noqa: F401 - moved to export/; old import path kept


def infer_all(runner, examples: Examples, batch: int = 64) -> dict[str, np.ndarray]:
    """Every output of an activated runner on all examples, batch by batch, concatenated."""
    parts = [runner.infer(examples.feeds(start, start + batch)) for start in range(0, len(examples), batch)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def predict(runner, examples: Examples, batch: int = 64) -> np.ndarray:
    """Final logits [N, S, V] of an activated runner on all examples."""
    return infer_all(runner, examples, batch)["logits"].astype(np.float32)


def onnx_accuracy(path: str, examples: Examples) -> dict[str, float]:
    """Accuracy of an ONNX graph (either mode) on ONNX Runtime CPU."""
    from hrm_deploy.runners.ort import OrtRunner

    runner = OrtRunner(path)
    runner.activate()
    try:
        return accuracy(predict(runner, examples), examples.labels)
    finally:
        runner.close()


def accuracy(logits: np.ndarray, labels: np.ndarray | None) -> dict[str, float]:
    if labels is None:
        raise DataError("these examples have no labels; accuracy needs a dataset folder (or a .npz with 'labels')")
    mask = labels != -100
    correct = (logits.argmax(-1) == labels) & mask
    exact = (correct.sum(-1) == mask.sum(-1)).mean()
    token = (correct.sum(-1) / np.maximum(mask.sum(-1), 1)).mean()
    return {"exact_accuracy": float(exact), "token_accuracy": float(token), "count": int(len(labels))}
