"""Per-step host overhead of the device loop (goal <= 20 us per step after capture), measured on the CPU with the fake TensorRT of the tests doing no maths ("noop")
on HostMemory, so only the loop's own Python cost is timed.

For each path the cost per step is the slope between a 1-step and a ``--steps``-step loop
(median call latency), which removes the fixed per-call cost (staging, upload, download):

- ``captured``: the step loop recorded once and replayed. HostMemory replays the recorded
  work item by item in Python, so this is an upper bound: a real CUDA graph replays the whole
  loop with one ``cudaGraphLaunch``;
- ``eager``: the loop enqueued step by step (no capture): what every step costs on the host
  where a graph cannot be used;
- ``halting``: eager plus the per-step download of the q logits, the host sync and the halt
  rule (which never halts here).

Also the bytes one call moves between host and device with Sudoku shapes (16 steps, 81 cells,
11 tokens, batch 1024), per-step answers reduced to their argmax on the device (the torch and host
memory backends) against every step's logits coming back (cuda-python, which has no device argmax).

    python benchmarks/loop_overhead.py [--steps 64] [--iters 200]
Writes benchmarks/results/loop_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.backends import open_runner
from hrm_deploy.backends.tensorrt import fake_trt
from hrm_deploy.backends.tensorrt.api import Backend


def _engine(folder: Path, steps: int) -> Path:
    path = folder / f"noop{steps}.engine"
    fake_trt.write_engine(path, steps=steps, noop=True, batch=(1, 64))
    return path


def _median_ms(runner, feeds, iters: int, halt) -> float:
    for _ in range(5):
        runner.infer(feeds, halt=halt)
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        runner.infer(feeds, halt=halt)
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def _bytes_per_call(folder: Path, batch: int = 1024, steps: int = 16) -> dict[str, dict[str, int]]:
    """h2d/d2h bytes of one call, per-step answers as device argmax vs as logits."""
    from hrm_deploy.runtime.memory import HostMemory

    path = folder / "sudoku-shapes.engine"
    shapes: dict[str, Any] = {"steps": steps, "seq": 81, "vocab": 11, "hidden": 16, "batch": (1, batch), "noop": True}
    fake_trt.write_engine(path, **shapes)
    feeds = {"inputs": np.ones((batch, 81), np.int64), "puzzle_identifiers": np.zeros(batch, np.int64)}
    out = {}
    for name in ("device_argmax", "logits_to_host"):
        saved = HostMemory.argmax
        if name == "logits_to_host":
            HostMemory.argmax = None  # type: ignore[assignment,method-assign]  # as cuda-python
        try:
            with open_runner(path, memory="host") as runner:
                runner.infer(feeds)
                timing = runner.last_timing or {}
                out[name] = {k: int(timing[k]) for k in ("h2d_bytes", "d2h_bytes")}
        finally:
            HostMemory.argmax = saved  # type: ignore[method-assign]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--out", default="benchmarks/results/loop_overhead.json")
    args = parser.parse_args()
    import hrm_deploy.backends.tensorrt.runner as trt_runner

    trt_runner.load_backend = lambda name: Backend("tensorrt", fake_trt)  # type: ignore[assignment]
    rng = np.random.default_rng(0)
    feeds = {"inputs": rng.integers(0, 5, (args.batch, 6)), "puzzle_identifiers": np.zeros(args.batch, np.int64)}

    def never(step, q_halt, q_continue):
        return np.zeros(len(q_halt), bool)

    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for path_name, cuda_graph, halt in (
            ("captured", True, None),
            ("eager", False, None),
            ("halting", False, never),
        ):
            ms = {}
            for steps in (1, args.steps):
                runner = open_runner(
                    _engine(Path(tmp), steps), memory="host", step_predictions=False, cuda_graph=cuda_graph
                )
                with runner:
                    ms[steps] = _median_ms(runner, feeds, args.iters, halt)
            per_step_us = (ms[args.steps] - ms[1]) / (args.steps - 1) * 1e3
            results[path_name] = {
                "call_ms_1_step": ms[1],
                f"call_ms_{args.steps}_steps": ms[args.steps],
                "per_step_us": per_step_us,
            }
            print(
                f"{path_name:9s} per step {per_step_us:7.2f} us   (1 step {ms[1]:.3f} ms, {args.steps} steps "
                f"{ms[args.steps]:.3f} ms per call)"
            )
        moved = _bytes_per_call(Path(tmp))
        for name, row in moved.items():
            print(
                f"{name:15s} per call at batch 1024, 16 steps: {row['h2d_bytes'] / 1e6:.2f} MB up, "
                f"{row['d2h_bytes'] / 1e6:.2f} MB down"
            )
    report = {
        "benchmark": "device loop host overhead per ACT step (fake TensorRT, HostMemory, no maths)",
        "bytes_per_call_batch_1024_16_steps": moved,
        "goal_us_per_step_after_capture": 20.0,
        "batch": args.batch,
        "steps": args.steps,
        "iters": args.iters,
        "results": results,
        "note": "captured = HostMemory's emulated replay (Python, item by item): an upper bound for a real "
        "CUDA graph, which is one launch per loop; measured on a shared 2-core CPU",
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
