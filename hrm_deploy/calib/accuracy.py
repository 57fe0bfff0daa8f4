"""Exact and token accuracy of an ONNX graph on labelled examples (ORT CPU), for either
graph mode: an unrolled graph in one call, a single-step graph driven segment by segment."""

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


def predict(session, examples: Examples, mode: str, steps: int, batch: int = 64) -> np.ndarray:
    """Final logits [N, S, V] of the graph on all examples."""
    outs = []
    for start in range(0, len(examples), batch):
        feeds = examples.feeds(start, start + batch)
        if mode == "step":
            from hrm_deploy.export.parity import run_stepwise

            shape = next(i.shape for i in session.get_inputs() if i.name == "z_H")
            n = len(feeds["inputs"])
            z_H = np.zeros((n, shape[1], shape[2]), np.float32)
            z_L = np.zeros_like(z_H)
            for step in range(steps):
                z_H, z_L, logits = session.run(["z_H_out", "z_L_out", "logits"],
                                               {**feeds, "z_H": z_H, "z_L": z_L, "reset": np.full((n,), step == 0)})
            outs.append(logits)
        else:
            outs.append(session.run(["logits"], feeds)[0])
    return np.concatenate(outs).astype(np.float32)


def accuracy(logits: np.ndarray, labels: np.ndarray | None) -> dict[str, float]:
    if labels is None:
        raise DataError("these examples have no labels; accuracy needs a dataset folder (or a .npz with 'labels')")
    mask = labels != -100
    correct = (logits.argmax(-1) == labels) & mask
    exact = (correct.sum(-1) == mask.sum(-1)).mean()
    token = (correct.sum(-1) / np.maximum(mask.sum(-1), 1)).mean()
    return {"exact_accuracy": float(exact), "token_accuracy": float(token), "count": int(len(labels))}
