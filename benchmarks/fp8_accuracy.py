"""FP8 (E4M3) against FP32 per ACT step on the bundled trained ACT model, on ONNX Runtime CPU.

Bundled model (``DEFAULT_PRESET``, sudoku-small, 8 ACT steps), unrolled export with per-step
predictions; FP8 and, for comparison in the same run, INT8 Q/DQ graphs from one calibration
(``make_precision_graph``, minmax, K=128, one shared range cache). ONNX Runtime's CPU float8
QuantizeLinear/DequantizeLinear kernels execute the FP8 rounding exactly as the graph states it
(the GEMM itself then runs in float32, as TensorRT's FP8 GEMMs accumulate in float32).
Per ACT step: exact accuracy of each graph, the loss in points, and the fraction of labelled
cells whose argmax differs from FP32 (how the error grows, or not, over the recurrence).

    nice python benchmarks/fp8_accuracy.py [--test-puzzles 1000]
Writes benchmarks/results/fp8_accuracy.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path


def measure(work: Path, test_puzzles: int, calib_samples: int) -> dict:
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph
    from hrm_deploy.precision.fp8 import per_step_agreement
    from hrm_deploy.train.presets import DEFAULT_PRESET, bundled_checkpoint, preset

    data = work / "data"
    blanks = preset(DEFAULT_PRESET)["data"]["blanks"]
    generate_sudoku(SudokuSpec(train=calib_samples, test=test_puzzles, blanks=blanks, seed=12345), str(data))
    config = ExportConfig(parity=False, step_predictions=True)
    fp32 = export_onnx(bundled_checkpoint(), work / "bundled.onnx", config, quiet=True).path
    test = load_examples(str(data), None, split="test")
    result: dict = {"preset": DEFAULT_PRESET, "test_puzzles": len(test), "calibration_samples": calib_samples}
    for precision in ("fp8", "int8"):
        start = time.perf_counter()
        graph = make_precision_graph(
            fp32,
            PrecisionConfig(
                precision,
                calib_data=str(data),
                cache_dir=str(work / "calib"),
                quant=QuantConfig(samples=calib_samples),
            ),
            work / f"bundled.{precision}.onnx",
            quiet=True,
        )
        seconds = time.perf_counter() - start
        steps = per_step_agreement(str(fp32), str(graph.path), test)
        result.setdefault("fp32_exact_pct_per_step", [round(x, 2) for x in steps["reference_exact"]])
        result[precision] = {
            "exact_pct_per_step": [round(x, 2) for x in steps["candidate_exact"]],
            "loss_points_per_step": [
                round(r - c, 2) for r, c in zip(steps["reference_exact"], steps["candidate_exact"])
            ],
            "argmax_agreement_per_step": [round(x, 5) for x in steps["argmax_agreement"]],
            "cells_differing_pct_per_step": [round(100 * (1 - x), 3) for x in steps["argmax_agreement"]],
            "quantized_nodes": graph.report["quantized_nodes"],
            "conversion_seconds": round(seconds, 2),
            "calibration_reused": graph.report["calibration"]["reused"],
        }
        print(precision, json.dumps(result[precision]), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--test-puzzles", type=int, default=1000)
    parser.add_argument("--calib-samples", type=int, default=128)
    parser.add_argument("--out", default="benchmarks/results/fp8_accuracy.json")
    args = parser.parse_args()
    report: dict = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average_at_start": os.getloadavg()}
    }
    import onnxruntime

    report["onnxruntime"] = onnxruntime.__version__
    with tempfile.TemporaryDirectory() as tmp:
        report["bundled"] = measure(Path(tmp), args.test_puzzles, args.calib_samples)
    report["machine"]["load_average_at_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
