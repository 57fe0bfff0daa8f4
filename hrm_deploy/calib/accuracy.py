"""Exact and token accuracy of a runner's answers on labelled examples."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from hrm_deploy.calib.data import Examples
from hrm_deploy.errors import ArtifactError, DataError


def graph_metadata(model) -> dict[str, Any]:
    """The ``hrm_deploy.*`` metadata an export wrote into the graph (mode, steps, config...)."""
    meta = {p.key[len("hrm_deploy."):]: p.value for p in model.metadata_props if p.key.startswith("hrm_deploy.")}
    if "mode" not in meta:
        raise ArtifactError("this ONNX has no hrm_deploy metadata; use a graph written by `hrm-deploy export`")
    meta["steps"] = int(meta.get("steps", 1))
    meta["config"] = json.loads(meta.get("config", "{}"))
    return meta


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
