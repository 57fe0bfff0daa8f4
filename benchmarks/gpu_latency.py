"""GPU latency of the Sudoku-size model: the PyTorch reference (eager, and
optionally torch.compile with CUDA graphs), the AOTInductor step engine through the device
loop with the captured 16-step loop, and the AOTInductor unrolled engine; batch 1 / 64 / 1024;
median end-to-end latency per call (host arrays in, host arrays out) and puzzles/s, measured
in one run so the ratios compare like with like.

    python benchmarks/gpu_latency.py [--iters 50] [--seconds 3] [--batches 1 64 1024] [--checkpoint CKPT]
Writes benchmarks/results/gpu_latency.json (rewritten after every row, so a run cut short keeps
what it measured). Random weights unless --checkpoint is given (latency does not depend on the
weights). Each artifact and batch runs ``--iters`` calls or ``--seconds``, whichever ends first
(at least 5 calls). Needs a CUDA GPU: refuses cleanly without one.

Goal: batch 1 <= 10 ms (stretch 5 ms), >= 2,000 puzzles/s at 1024. Upstream anchors on
an H100: eager loop 261 ms at batch 1 (530 puzzles/s at 1024); torch.compile max-autotune + CUDA
graph 18.4 ms at batch 1, 1,620 puzzles/s at 1024. Decision rule: if the captured step loop is
within 10 % of the unrolled engine, step mode becomes the default engine mode everywhere.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _median_ms(runner, feeds, iters: int, warmup: int, seconds: float) -> tuple[float, dict]:
    for _ in range(warmup):
        runner.infer(feeds)
    times, phases = [], []
    begin = time.perf_counter()
    while len(times) < iters and (len(times) < 5 or time.perf_counter() - begin < seconds):
        start = time.perf_counter()
        runner.infer(feeds)
        times.append(time.perf_counter() - start)
        if runner.last_timing and "compute_ms" in runner.last_timing:
            phases.append(runner.last_timing)
    keys = ("h2d_ms", "compute_ms", "d2h_ms", "h2d_bytes", "d2h_bytes")
    median = {k: float(np.median([p[k] for p in phases])) for k in keys if k in phases[0]} if phases else {}
    median["calls"] = len(times)
    if phases:
        median["peak_gpu_mib"] = max(p.get("peak_gpu_mib") or 0.0 for p in phases)
    return float(np.median(times)) * 1e3, median


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget per artifact and batch")
    parser.add_argument("--modes", nargs="+", default=["step", "unrolled"], help="engine modes to build and time")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--checkpoint", default=None, help="trained Sudoku checkpoint (default: random weights)")
    parser.add_argument("--no-compiled-reference", action="store_true", help="skip torch.compile reduce-overhead")
    parser.add_argument("--out", default="benchmarks/results/gpu_latency.json")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(
            "gpu_latency: no CUDA GPU visible to torch here; run it on a machine with an NVIDIA GPU "
            "(nothing was measured, no results file written)",
            file=sys.stderr,
        )
        return 2
    from sudoku_size import sudoku_size_model

    from hrm_deploy.backends import open_runner
    from hrm_deploy.backends.reference import TorchRunner
    from hrm_deploy.backends.torch.builder import TorchEngineConfig, build_torch_engine
    from hrm_deploy.model.checkpoint import save_checkpoint

    rows: list[dict] = []
    max_batch = max(args.batches)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.checkpoint:
            ckpt = Path(args.checkpoint)
        else:
            ckpt = save_checkpoint(work / "sudoku-random.pt", sudoku_size_model(seed=0))
        engines = {}
        for mode in args.modes:
            start = time.perf_counter()
            result = build_torch_engine(
                ckpt,
                TorchEngineConfig(mode=mode, max_batch=max_batch, device="cuda"),
                work / f"sudoku.{mode}.pt2",
                quiet=True,
            )
            manifest = json.loads((work / f"sudoku.{mode}.pt2.manifest.json").read_text())
            engines[mode] = result.path
            rows.append(
                {
                    "name": f"aoti_{mode}",
                    "build_s": time.perf_counter() - start,
                    "compile_path": manifest["compile_path"],
                    "fallback": manifest.get("compile_fallback_reason"),
                    "batches": {},
                }
            )
            print(f"built {mode} engine in {rows[-1]['build_s']:.1f} s ({manifest['compile_path']})", flush=True)
        candidates = [("reference_eager", lambda: TorchRunner(ckpt, device="cuda"))]
        candidates += [
            (f"aoti_{mode}", lambda mode=mode: open_runner(engines[mode], step_predictions=False))
            for mode in args.modes
        ]
        if not args.no_compiled_reference:
            candidates.insert(1, ("reference_compiled", lambda: TorchRunner(ckpt, device="cuda", compile=True)))
        rng = np.random.default_rng(0)
        base = {"inputs": rng.integers(1, 11, (max_batch, 81)), "puzzle_identifiers": np.zeros(max_batch, np.int32)}
        for name, make in candidates:
            row = next((r for r in rows if r["name"] == name), None)
            if row is None:
                row = {"name": name, "batches": {}}
                rows.append(row)
            with make() as runner:
                row["steps"] = runner.steps
                row["runtime"] = dict(getattr(runner, "runtime_settings", {}) or {})
                for batch in args.batches:
                    feeds = {k: v[:batch] for k, v in base.items()}
                    ms, phases = _median_ms(runner, feeds, args.iters, args.warmup, args.seconds)
                    row["batches"][str(batch)] = {
                        "median_ms": ms,
                        "puzzles_per_s": batch / ms * 1e3,
                        "phases_ms": phases,
                    }
                    print(f"{name:20s} batch {batch:5d}: {ms:9.3f} ms  {batch / ms * 1e3:10.1f} puzzles/s", flush=True)
                row["runtime"] = dict(getattr(runner, "runtime_settings", {}) or {})  # the loop path that ran
            _write(args, rows, torch)
    return 0


def _write(args, rows: list[dict], torch) -> None:
    by_name = {r["name"]: r for r in rows}
    step, unrolled = (
        by_name.get("aoti_step", {}).get("batches", {}),
        by_name.get("aoti_unrolled", {}).get("batches", {}),
    )
    ratio = {b: step[b]["median_ms"] / unrolled[b]["median_ms"] for b in step if b in unrolled}
    report = {
        "benchmark": "GPU latency, Sudoku-size model (16 ACT steps), end to end per call: host arrays in, "
        "host arrays out",
        "iters": args.iters,
        "seconds_per_batch": args.seconds,
        "weights": str(args.checkpoint or "random"),
        "rows": rows,
        "step_vs_unrolled_latency_ratio": ratio,
        "step_mode_default": all(r <= 1.10 for r in ratio.values()) if ratio else None,
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(out)
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
