"""Accuracy of an ONNX graph on held-out examples (the precision stage's check).

It runs the graph through the base's ONNX Runtime session and step loop
(:mod:`hrm_deploy.onnx_runtime`), not through a backend's runner: the precision room imports no
backend."""

from __future__ import annotations

import numpy as np

from hrm_deploy.data.examples import Examples
from hrm_deploy.metrics import accuracy


def onnx_accuracy(path: str, examples: Examples, batch: int = 64) -> dict[str, float]:
    """Accuracy of an ONNX graph (either mode) on ONNX Runtime CPU: an unrolled graph in one call
    per batch, a single-step graph driven through all its ACT steps."""
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.manifest import check_artifact
    from hrm_deploy.onnx_runtime import load_onnx, ort_session, run_stepwise
    from hrm_deploy.puzzle_table import rows_session

    manifest = check_artifact(path)  # a graph whose manifest describes other bytes is refused
    meta = graph_metadata(load_onnx(path))
    # export --puzzle-emb external: the session gathers the rows of the ids it is fed
    session = rows_session(ort_session(path, provider="cpu"), path, manifest)
    logits = []
    for start in range(0, len(examples), batch):
        feeds = {k: np.asarray(v, np.int32) for k, v in examples.feeds(start, start + batch).items()}
        if meta["mode"] == "step":
            logits.append(run_stepwise(session, feeds, None, int(meta["steps"]))["logits"])
        else:
            logits.append(session.run(["logits"], feeds)[0])
    return accuracy(np.concatenate(logits).astype(np.float32), examples.labels)
