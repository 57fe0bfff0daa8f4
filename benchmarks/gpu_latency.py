"""GPU latency of the Sudoku-size model: the PyTorch reference (eager, and optionally
torch.compile with CUDA graphs) and the AOTInductor step engine through the device loop with the
captured 16-step loop (the unrolled engine only when asked: its compile is long); batch 1 / 64 /
1024; median end-to-end latency per call (host arrays in, host arrays out) and puzzles/s,
measured in one run so the ratios compare like with like.

    python benchmarks/gpu_latency.py [--iters 50] [--seconds 3] [--batches 1 64 1024] [--checkpoint CKPT]
        [--step-engine ENGINE.pt2] [--precision fp32|bf16] [--modes step unrolled] [--profile]
    python benchmarks/gpu_latency.py --save-checkpoint PATH   (the random-weight model, then exit)

Writes benchmarks/results/gpu_latency.json, rewritten after every measured batch, so a run cut
short keeps every row it measured. Random weights unless --checkpoint is given (latency does not
depend on the weights). ``--step-engine`` reuses a step engine already built (compile each model
once). Each artifact and batch runs ``--iters`` calls or ``--seconds``, whichever ends first (at
least ``--min-calls``). ``--profile`` adds, per engine batch, one call under torch.profiler: GPU
kernel time against the gaps between kernels, per ACT step, so a missed goal says where the time
went. Needs a CUDA GPU for the measurement: refuses cleanly without one.

Goal: batch 1 <= 10 ms (stretch 5 ms), >= 2,000 puzzles/s at 1024. Upstream anchors on an H100:
eager loop 261 ms at batch 1 (530 puzzles/s at 1024); torch.compile max-autotune + CUDA graph
18.4 ms at batch 1, 1,620 puzzles/s at 1024.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _median_ms(runner, feeds, iters: int, warmup: int, seconds: float, min_calls: int) -> tuple[float, dict]:
    for _ in range(warmup):
        runner.infer(feeds)
    times: list[float] = []
    phases: list[Any] = []
    begin = time.perf_counter()
    while len(times) < iters and (len(times) < min_calls or time.perf_counter() - begin < seconds):
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


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by ``intervals`` (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def split_gpu_time(kernels: list[tuple[float, float]], copies: list[tuple[float, float]], wall_ms: float, steps: int):
    """Where one call's wall time went, from the GPU activity intervals (microseconds) of a
    profiled call: kernel time, copy time, the gaps between them while the GPU had work queued or
    waited for the host (launch overhead, syncs) and host time before the first / after the
    last GPU activity; kernel and gap time also per ACT step."""
    busy = kernels + copies
    if not busy:
        return {"wall_ms": wall_ms, "kernels_visible": False}
    span_us = max(b for _, b in busy) - min(a for a, _ in busy)
    kernel_ms, copy_ms = _union_us(kernels) / 1e3, _union_us(copies) / 1e3
    gap_ms = (span_us - _union_us(busy)) / 1e3
    return {
        "wall_ms": wall_ms,
        "kernels_visible": bool(kernels),
        "kernels": len(kernels),
        "kernel_ms": kernel_ms,
        "copy_ms": copy_ms,
        "gap_ms": gap_ms,
        "host_outside_gpu_ms": max(wall_ms - span_us / 1e3, 0.0),
        "per_step": {"kernel_ms": kernel_ms / steps, "gap_ms": gap_ms / steps, "kernels": len(kernels) / steps},
    }


def profile_call(runner, feeds, steps: int) -> dict:
    """One ``runner.infer`` under torch.profiler (CUDA activity), split by :func:`split_gpu_time`.
    Kernels replayed from a CUDA graph appear where the profiler's CUPTI traces graph launches;
    ``kernels_visible`` says whether they did."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    runner.infer(feeds)  # warm: plans and graphs exist before the profiled call
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        start = time.perf_counter()
        runner.infer(feeds)
        if cuda:
            torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3
    kernels: list[tuple[float, float]] = []
    copies: list[tuple[float, float]] = []
    for event in prof.profiler.kineto_results.events():  # the raw trace: device activity with ns times
        if str(event.device_type()).endswith("CUDA"):
            interval = (event.start_ns() / 1e3, (event.start_ns() + event.duration_ns()) / 1e3)
            (copies if event.name().startswith(("Memcpy", "Memset")) else kernels).append(interval)
    return split_gpu_time(kernels, copies, wall_ms, steps)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="time budget per artifact and batch")
    parser.add_argument("--min-calls", type=int, default=5, help="timed calls per artifact and batch, at least")
    parser.add_argument(
        "--modes", nargs="+", default=["step"], help="engine modes to build (unrolled: a long compile of 16 steps)"
    )
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="engines built here")
    parser.add_argument("--step-engine", default=None, help="a step engine already built: timed, not rebuilt")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--checkpoint", default=None, help="trained Sudoku checkpoint (default: random weights)")
    parser.add_argument("--no-compiled-reference", action="store_true", help="skip torch.compile reduce-overhead")
    parser.add_argument(
        "--no-reference", action="store_true", help="time the engines only (the references' rows are recorded)"
    )
    parser.add_argument("--profile", action="store_true", help="kernel time vs gaps per ACT step (torch.profiler)")
    parser.add_argument("--save-checkpoint", default=None, help="save the random-weight model here and exit")
    parser.add_argument("--out", default="benchmarks/results/gpu_latency.json")
    args = parser.parse_args()
    import torch
    from sudoku_size import sudoku_size_model

    from hrm_deploy.model.checkpoint import save_checkpoint

    if args.save_checkpoint:
        print(f"saved {save_checkpoint(Path(args.save_checkpoint), sudoku_size_model(seed=0))}", flush=True)
        return 0
    if not torch.cuda.is_available():
        print(
            "gpu_latency: no CUDA GPU visible to torch here; run it on a machine with an NVIDIA GPU "
            "(nothing was measured, no results file written)",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ckpt = Path(args.checkpoint) if args.checkpoint else save_checkpoint(work / "r.pt", sudoku_size_model(seed=0))
        rows: list[dict] = []
        engines = _engines(args, ckpt, work, rows, torch)
        _measure(args, ckpt, engines, rows, torch)
    return 0


def _engines(args, ckpt: Path, work: Path, rows: list[dict], torch) -> dict[str, Path]:
    """The engines to time: ``--step-engine`` as given, the other modes built here (one row each)."""
    from hrm_deploy.backends.torch.builder import TorchEngineConfig, build_torch_engine

    engines: dict[str, Path] = {}
    modes = [m for m in args.modes if not (m == "step" and args.step_engine)]
    if args.step_engine:
        engines["step"] = Path(args.step_engine)
        manifest = json.loads(Path(args.step_engine + ".manifest.json").read_text())
        rows.append(_row("aoti_step", manifest, None))
    for mode in modes:
        start = time.perf_counter()
        config = TorchEngineConfig(mode=mode, max_batch=max(args.batches), device="cuda", precision=args.precision)
        result = build_torch_engine(ckpt, config, work / f"sudoku.{mode}.pt2", quiet=True)
        engines[mode] = result.path
        manifest = json.loads(result.manifest.read_text())
        rows.append(_row(f"aoti_{mode}", manifest, time.perf_counter() - start))
        print(f"built {mode} engine in {rows[-1]['build_s']:.1f} s ({manifest['compile_path']})", flush=True)
        _write(args, rows, torch)
    return engines


def _row(name: str, manifest: dict, build_s: float | None) -> dict:
    return {
        "name": name,
        "build_s": build_s,
        "precision": manifest.get("precision"),
        "tf32": manifest.get("tf32"),
        "compile_path": manifest.get("compile_path"),
        "fallback": manifest.get("compile_fallback_reason"),
        "load_check": manifest.get("load_check"),
        "batches": {},
    }


def _opener(path: Path) -> Callable[[], Any]:
    """A deferred open_runner of ``path`` (each candidate is opened when its turn comes)."""
    from hrm_deploy.backends import open_runner

    return lambda: open_runner(path, step_predictions=False)


def _measure(args, ckpt: Path, engines: dict[str, Path], rows: list[dict], torch) -> None:
    """Time every candidate at every batch; the JSON is rewritten after each batch."""
    from hrm_deploy.backends.reference import TorchRunner

    # the engines first: their rows are the goal, and a package once died loading after the CUDA reference ran
    candidates: list[tuple[str, Callable[[], Any]]] = [(f"aoti_{mode}", _opener(engines[mode])) for mode in engines]
    if not args.no_reference:
        candidates.append(("reference_eager", lambda: TorchRunner(ckpt, device="cuda")))  # type: ignore[misc]
    if not (args.no_compiled_reference or args.no_reference):
        candidates.append(("reference_compiled", lambda: TorchRunner(ckpt, device="cuda", compile=True)))  # type: ignore[misc]
    max_batch = max(args.batches)
    rng = np.random.default_rng(0)
    base: dict[str, Any] = {
        "inputs": rng.integers(1, 11, (max_batch, 81)),
        "puzzle_identifiers": np.zeros(max_batch, np.int32),
    }
    for name, make in candidates:
        found = next((r for r in rows if r["name"] == name), None)
        row: dict[str, Any] = found if found is not None else {"name": name, "batches": {}}
        if found is None:
            rows.append(row)
        with make() as runner:
            row["steps"] = runner.steps
            row["path"] = getattr(runner, "engine_path", "reference")  # the engine, or its fallback
            for batch in args.batches:
                feeds: dict[str, Any] = {k: v[:batch] for k, v in base.items()}
                ms, phases = _median_ms(runner, feeds, args.iters, args.warmup, args.seconds, args.min_calls)
                row["batches"][str(batch)] = {"median_ms": ms, "puzzles_per_s": batch / ms * 1e3, "phases_ms": phases}
                if args.profile and name.startswith("aoti_"):
                    row["batches"][str(batch)]["profile"] = profile_call(runner, feeds, runner.steps)
                row["runtime"] = dict(getattr(runner, "runtime_settings", {}) or {})  # the loop path that ran
                print(f"{name:20s} batch {batch:5d}: {ms:9.3f} ms  {batch / ms * 1e3:10.1f} puzzles/s", flush=True)
                _write(args, rows, torch)


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


if __name__ == "__main__":
    sys.exit(main())
