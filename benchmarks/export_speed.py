"""Export speed and ONNX Runtime vs PyTorch latency of the Sudoku-size HRM (random weights).

Writes benchmarks/results/export_speed.json and prints a summary. Run:
    python benchmarks/export_speed.py [--steps 16] [--out benchmarks/results/export_speed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
from hrm_deploy.export.parity import ort_session, sample_inputs
from hrm_deploy.export.unroll import unroll
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.hrm import build_model

SUDOKU = HRMConfig(seq_len=81, vocab_size=11, num_puzzle_identifiers=1, puzzle_emb_ndim=512)


def median_ms(fn, iters: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/export_speed.json")
    args = parser.parse_args()

    model = build_model(SUDOKU, seed=0).eval()
    results: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                 "torch": torch.__version__, "torch_threads": torch.get_num_threads()},
                     "model": SUDOKU.to_dict(), "steps": args.steps}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sudoku.onnx"
        start = time.perf_counter()
        # Parity is part of a real export; random weights are chaotic over 16 steps, which the
        # noise-floor criterion accounts for.
        res = export_onnx(model, out, ExportConfig(steps=args.steps), quiet=True)
        results["export_seconds_total"] = round(time.perf_counter() - start, 2)
        results["export_stage_seconds"] = res.timings
        results["export_seconds_without_parity"] = round(sum(
            v for k, v in res.timings.items() if not k.startswith("parity")), 2)
        results["parity_note"] = ("random weights are chaotic over 16 steps, so parity needs the float64 "
                                  "noise-floor reference; on trained weights the cheap strict check suffices")
        results["onnx_nodes"] = res.nodes
        results["onnx_mb"] = round(out.stat().st_size / 1e6, 1)

        session = ort_session(str(out))
        fixed = unroll(model, args.steps)
        latency = {}
        for batch in (1, 8):
            feeds = sample_inputs(SUDOKU, batch, seed=batch)
            t_in = torch.from_numpy(feeds["inputs"]), torch.from_numpy(feeds["puzzle_identifiers"])
            ort_ms = median_ms(lambda feeds=feeds: session.run(None, feeds), args.iters)
            with torch.inference_mode():
                torch_ms = median_ms(lambda t_in=t_in: fixed(*t_in), args.iters)
            latency[str(batch)] = {"ort_fp32_ms_per_puzzle": round(ort_ms / batch, 2),
                                   "torch_eager_fp32_ms_per_puzzle": round(torch_ms / batch, 2),
                                   "ratio_torch_over_ort": round(torch_ms / ort_ms, 3)}
        results["cpu_latency"] = latency
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
