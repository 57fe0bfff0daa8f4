"""What the serving-load benchmarks share (``serve_load.py`` over HTTP, ``inflight_load.py`` in
process): the puzzles, the Sudoku-size checkpoint with a Q head that spreads halting, the
``threshold:X`` rule that makes its step count vary, the step-graph export, and the closed-loop
client driver with its summary. Imported by the scripts beside it (``python benchmarks/<script>.py``
puts this folder on ``sys.path``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

PUZZLES = 512  # distinct puzzles the clients cycle through
PUZZLE_SEED = 7
SUDOKU_SIZE_BLANKS = (40, 50)


def sudoku_puzzles(blanks: tuple[int, int], n: int = PUZZLES, seed: int = PUZZLE_SEED) -> np.ndarray:
    """``n`` 9x9 Sudoku puzzles (int32 [n, 81]) from the project's generator, fixed by ``seed``."""
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    split = generate_sudoku(SudokuSpec(train=0, test=n, blanks=(blanks[0], blanks[1]), augment=0, seed=seed))["test"]
    return np.ascontiguousarray(split.inputs, dtype=np.int32)


def bundled_puzzles(n: int = PUZZLES, seed: int = PUZZLE_SEED) -> np.ndarray:
    """Puzzles of the bundled sudoku-small checkpoint's own data preset (its blanks range)."""
    from hrm_deploy.train.presets import preset

    return sudoku_puzzles(tuple(preset("sudoku-small")["data"]["blanks"]), n, seed)


def sudoku_size_checkpoint(work: Path) -> Path:
    """The random-weight Sudoku-size checkpoint (``sudoku_size.py``) with a random Q head: upstream
    inits the Q head to zero, which would halt every puzzle at the same step."""
    import torch
    from sudoku_size import sudoku_size_model

    from hrm_deploy.model.checkpoint import save_checkpoint

    model = sudoku_size_model(seed=0).eval()
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1)
        model.inner.q_head.weight.normal_(0, 0.05)
    return Path(save_checkpoint(work / "sudoku-size.pt", model))


def spread_threshold(runner: Any, tokens: np.ndarray) -> str:
    """``threshold:X`` with X the 90th percentile of sigmoid(q_halt) over all steps of 32 puzzles
    (an active runner, no halting): the step count then varies from puzzle to puzzle."""
    feeds = {"inputs": tokens[:32], "puzzle_identifiers": np.zeros(min(32, len(tokens)), np.int32)}
    q = runner.infer(feeds)["q_halt_logits"]
    return f"threshold:{float(np.percentile(1 / (1 + np.exp(-q)), 90)):.6f}"


def step_graph(checkpoint: str | Path, out: Path) -> Path:
    """The checkpoint exported as an ONNX step graph (``hrm-deploy export --mode step``) at ``out``."""
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx

    return Path(export_onnx(str(checkpoint), out, ExportConfig(mode="step", parity=False), quiet=True).path)


def summary(latencies: list[float], wall: float, done: int, failed: int, steps: list[int]) -> dict:
    """Puzzles/s, p50/p99/worst latency (ms) and mean ACT steps of one measurement point."""
    lat = np.asarray(latencies or [np.nan]) * 1e3
    return {
        "puzzles_per_s": done / wall,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "worst_ms": float(np.max(lat)),
        "answered": done,
        "failed": failed,
        "mean_steps": float(np.mean(steps)) if steps else None,
        "wall_s": wall,
    }


def closed_loop(call: Callable[[int], tuple[bool, int]], n: int, duration: float) -> dict:
    """``n`` client threads, each sending one puzzle at a time for ``duration`` s; ``call(i)``
    answers puzzle i and returns (ok, ACT steps it ran). Client c starts at puzzle c * 997."""
    latencies: list[float] = []
    steps: list[int] = []
    failed = [0]
    lock = threading.Lock()
    start = time.perf_counter()
    end = start + duration

    def run(c: int) -> None:
        i = c * 997
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            ok, used = call(i)
            with lock:
                if ok:
                    latencies.append(time.perf_counter() - t0)
                    steps.append(used)
                else:
                    failed[0] += 1
            i += 1

    threads = [threading.Thread(target=run, args=(c,)) for c in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return summary(latencies, time.perf_counter() - start, len(latencies), failed[0], steps)
