"""INT8 calibration: accuracy against calibration size K and method.

Bundled trained ACT model (``DEFAULT_PRESET``, sudoku-small, 8 steps): TensorRT-convention Q/DQ
graph (``make_precision_graph``) of its unrolled export for K in 32..512 and entropy / minmax /
percentile; exact accuracy on 2,000 held-out puzzles of the preset's difficulty on ONNX Runtime
CPU (which executes Q/DQ faithfully), the puzzles INT8 flips either way (FP32 right and INT8
wrong, and the reverse: their difference is the loss, their sum its noise; on 500 puzzles the
loss wandered 0.4-2.8 points with K), and the conversion's seconds. What range collection costs
over plain inference is measured by ``benchmarks/calib_overhead.py``.

    nice python benchmarks/calib_size.py [--sizes 32,64,128,256,512]
Writes benchmarks/results/calib_size.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path


def solved(path: Path, examples):
    """Per puzzle: is every labelled cell right (the exact-accuracy criterion)."""
    from hrm_deploy.backends.ort.runner import OrtRunner
    from hrm_deploy.runtime.infer import predict

    runner = OrtRunner(str(path))
    runner.activate()
    try:
        predictions = predict(runner, examples).argmax(-1)
    finally:
        runner.close()
    mask = examples.labels != -100
    return ((predictions == examples.labels) | ~mask).all(-1)


def bundled_sweep(work: Path, sizes: list[int], methods: list[str], test_puzzles: int) -> dict:
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph
    from hrm_deploy.train.presets import DEFAULT_PRESET, bundled_checkpoint, preset

    data = work / "data"
    generate_sudoku(
        SudokuSpec(train=max(sizes), test=test_puzzles, blanks=preset(DEFAULT_PRESET)["data"]["blanks"], seed=12345),
        str(data),
    )
    fp32 = export_onnx(bundled_checkpoint(), work / "bundled.onnx", ExportConfig(parity=False), quiet=True).path
    test = load_examples(str(data), None, split="test")
    fp32_solved = solved(fp32, test)
    fp32_exact = round(100 * fp32_solved.mean(), 2)
    result: dict = {"preset": DEFAULT_PRESET, "fp32_exact_pct": fp32_exact, "test_puzzles": len(test), "runs": []}
    for method in methods:
        for k in sizes:
            out = work / f"bundled.{method}.k{k}.int8.onnx"
            start = time.perf_counter()
            make_precision_graph(
                fp32,
                PrecisionConfig(
                    "int8",
                    calib_data=str(data),
                    cache_dir=str(work / "calib"),
                    quant=QuantConfig(method=method, samples=k),
                ),
                out,
                quiet=True,
            )
            seconds = time.perf_counter() - start
            int8_solved = solved(out, test)
            exact = round(100 * int8_solved.mean(), 2)
            result["runs"].append(
                {
                    "method": method,
                    "k": k,
                    "exact_pct": exact,
                    "loss_points": round(fp32_exact - exact, 2),
                    "lost_puzzles": int((fp32_solved & ~int8_solved).sum()),
                    "gained_puzzles": int((~fp32_solved & int8_solved).sum()),
                    "seconds": round(seconds, 2),
                }
            )
            print("bundled", method, k, exact, round(seconds, 1), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="32,64,128,256,512")
    parser.add_argument("--methods", default="minmax,entropy,percentile")
    parser.add_argument("--test-puzzles", type=int, default=2000)
    parser.add_argument("--out", default="benchmarks/results/calib_size.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    methods = args.methods.split(",")
    report: dict = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average_at_start": os.getloadavg()}
    }
    with tempfile.TemporaryDirectory() as tmp:
        report["bundled"] = bundled_sweep(Path(tmp), sizes, methods, args.test_puzzles)
    report["machine"]["load_average_at_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
