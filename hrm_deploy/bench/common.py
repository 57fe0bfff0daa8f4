"""What bench and profile share (each imports this, neither imports the other): the batch bound,
tiling examples to a batch, the machine a measurement ran on, the default data and artifacts."""

from __future__ import annotations

import logging
import platform
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

MAX_BATCH = 4096  # a bench batch beyond this is a typo, not a measurement (and an OOM on most machines)


def tile(feeds: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
    """``feeds`` repeated to ``batch`` rows (a batch larger than the examples)."""
    reps = -(-batch // len(feeds["inputs"]))
    return {k: np.concatenate([v] * reps)[:batch] for k, v in feeds.items()}


def row_label(row: dict[str, Any]) -> str:
    """A report row's name in tables: runner, precision, file name (and ONNX Runtime's threads)."""
    name = f"{row.get('runner', '?')} {row.get('precision', '')} {Path(row['artifact']).name}".strip()
    threads = row.get("runtime", {}).get("intra_op_num_threads")
    return name + (f" ({threads} threads)" if isinstance(threads, int) else "")


def environment(target: str) -> dict[str, Any]:
    """The machine a measurement ran on: platform, CPUs, GPUs (nvidia-smi), library versions (and
    JetPack facts for ``target`` jetson)."""
    import os
    import sys

    from hrm_deploy.manifest import library_versions
    from hrm_deploy.system import CLOCKS, IDENTITY, nvidia_smi

    env: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        **nvidia_smi({**IDENTITY, **CLOCKS}),
        "versions": library_versions(),
    }
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch.version, "cuda", None):
        env["cuda"] = torch.version.cuda
    if target == "jetson":
        from hrm_deploy.bench.jetson import environment

        env["jetson"] = environment()
    return env


def bench_data(data: str | None, reference: str | None, paths: list[Path]) -> str:
    """``data`` as given, else the reference checkpoint's (or the first artifact's) own dataset,
    announced on stderr in one line."""
    if data:
        return data
    from hrm_deploy.provenance import default_data
    from hrm_deploy.train.presets import bundled_checkpoint

    choice = default_data(reference or (paths[0] if paths else bundled_checkpoint()), "--data", {"test": None})
    log.info(choice.message)
    return str(choice.path)


def default_artifacts() -> list[Path]:
    """Every engine in engines/ (TensorRT and PyTorch engines, by the runner table's suffixes)."""
    from hrm_deploy.artifacts import runner_name
    from hrm_deploy.registry import BACKENDS

    folder = Path("engines")
    return sorted(p for p in folder.glob("*") if p.is_file() and BACKENDS[runner_name(p)].kind in ("engine", "pt2"))
