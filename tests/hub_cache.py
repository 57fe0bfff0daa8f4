"""A Hugging Face Hub cache in huggingface_hub's real on-disk layout, built without a network:
``<HF_HOME>/hub/{models,datasets}--ORG--NAME/{refs/<ref>, blobs/<hash>, snapshots/<commit>/<file> -> blob}``."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def add_repo(hf_home: Path, repo_id: str, files: dict[str, bytes], repo_type: str = "model", ref: str = "main") -> str:
    """Put one snapshot of ``repo_id`` holding ``files`` into the cache; returns its commit sha.
    Files are content-addressed blobs linked from the snapshot, as huggingface_hub stores them."""
    repo = hf_home / "hub" / f"{repo_type}s--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(
        repr(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in files.items())).encode()
    ).hexdigest()
    snapshot = repo / "snapshots" / commit
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return commit


def published_checkpoint_files(model, data_path: str = "data/sudoku-extreme-1k-aug-1000") -> dict[str, bytes]:
    """A model in the published HRM repositories' layout: upstream's ``all_config.yaml`` and the
    step file saved as ``checkpoint``."""
    import tempfile

    from hrm_deploy.model.checkpoint import write_upstream_run

    with tempfile.TemporaryDirectory() as tmp:
        step = write_upstream_run(tmp, model, step=1000, data_path=data_path)
        return {"checkpoint": step.read_bytes(), "all_config.yaml": (Path(tmp) / "all_config.yaml").read_bytes()}


def sudoku_csv(rows: int, seed: int = 0) -> bytes:
    """A Sudoku-Extreme style CSV (``source,question,answer,rating``) of ``rows`` unique-solution puzzles."""
    import numpy as np

    from hrm_deploy.data.sudoku import make_puzzle

    rng = np.random.default_rng(seed)
    lines = ["source,question,answer,rating"]
    for _ in range(rows):
        board, solution, nodes = make_puzzle(rng, 20)
        q = "".join("." if v == 0 else str(v) for v in board.flatten())
        lines.append(f"generated,{q},{''.join(str(v) for v in solution.flatten())},{min(nodes, 99)}")
    return ("\n".join(lines) + "\n").encode()
