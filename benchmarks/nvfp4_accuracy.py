"""NVFP4 against FP32 per ACT step on the bundled trained ACT model, through the CPU simulation.

Bundled model (``DEFAULT_PRESET``, sudoku-small, 8 ACT steps), unrolled export with per-step
predictions. NVFP4 graphs (``make_precision_graph``, minmax calibration K=128 for the per-tensor
activation scales): every planned MatMul (plain), and with ``--accuracy-budget`` (the sensitivity
fallback, layers kept in float until the loss on a separate 256-puzzle holdout is within the budget).
ONNX Runtime has no FP4 kernels, so each graph runs as its simulation
(``hrm_deploy.precision.nvfp4.simulate_on_cpu``: the stored FP4 weights dequantized exactly, the
activations' dynamic block quantization as float operators), compared with FP32 by ``verify``'s
``compare`` on the evaluation puzzles: exact accuracy and argmax disagreement per ACT step, output
errors, the q_halt sign agreement, and which of ``verify``'s INT8/FP8 bounds would hold.

    nice python benchmarks/nvfp4_accuracy.py [--test-puzzles 1000] [--budget 1.0] [--holdout 256]
About 15 minutes on 2 busy cores, most of it the budgeted graph (14 holdout runs of the simulation).
Writes benchmarks/results/nvfp4_accuracy.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path


def _outputs(path: str, examples) -> dict:
    from hrm_deploy.backends.ort.runner import OrtRunner
    from hrm_deploy.precision.nvfp4 import cpu_runnable
    from hrm_deploy.runtime.infer import infer_all

    with cpu_runnable(path) as runnable:
        runner = OrtRunner(runnable)
        runner.activate()
        try:
            return infer_all(runner, examples, 64)
        finally:
            runner.close()


def _summary(fp32: dict, candidate: dict, labels, graph) -> dict:
    from hrm_deploy.precision.registry import PRECISIONS
    from hrm_deploy.verify import compare, judge

    report = compare(fp32, candidate, labels)
    ref, cand = report["per_step_exact_reference"], report["per_step_exact_candidate"]
    return {
        "exact_pct_per_step": [round(100 * x, 2) for x in cand],
        "loss_points_per_step": [round(100 * (r - c), 2) for r, c in zip(ref, cand)],
        "cells_differing_pct_per_step": [round(100 * x, 3) for x in report["per_step_disagreement"]],
        "logits_max_rel_error": round(report["logits"]["max_rel"], 4),
        "q_halt_sign_agreement": round(report["q_halt"]["sign_agreement"], 4),
        "verify_failures_at_int8_bounds": judge(report, PRECISIONS["int8"].thresholds),
        "quantized_nodes": graph.report["quantized_nodes"],
    }


def measure(work: Path, test_puzzles: int, calib_samples: int, budget: float, holdout: int) -> dict:
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph
    from hrm_deploy.train.presets import DEFAULT_PRESET, bundled_checkpoint, preset

    blanks = preset(DEFAULT_PRESET)["data"]["blanks"]
    # calibration (train split) and the budget's holdout (test split) in one folder, evaluation in another
    data, evaluation = work / "data", work / "evaluation"
    generate_sudoku(SudokuSpec(train=calib_samples, test=holdout, blanks=blanks, seed=12345), str(data))
    generate_sudoku(SudokuSpec(train=1, test=test_puzzles, blanks=blanks, seed=777), str(evaluation))
    export = ExportConfig(parity=False, step_predictions=True)
    fp32 = export_onnx(bundled_checkpoint(), work / "bundled.onnx", export, quiet=True)
    test = load_examples(str(evaluation), None, split="test")
    reference = _outputs(str(fp32.path), test)
    from hrm_deploy.verify import compare

    fp32_exact = compare(reference, reference, test.labels)["per_step_exact_reference"]
    result: dict = {
        "preset": DEFAULT_PRESET,
        "test_puzzles": len(test),
        "calibration_samples": calib_samples,
        "budget_holdout_puzzles": holdout,
        "fp32_exact_pct_per_step": [round(100 * x, 2) for x in fp32_exact],
    }
    for name, accuracy_budget in (("nvfp4", None), (f"nvfp4_budget_{budget:g}", budget)):
        start = time.perf_counter()
        config = PrecisionConfig(
            "nvfp4",
            calib_data=str(data),
            cache_dir=str(work / "calib"),
            quant=QuantConfig(samples=calib_samples),
            accuracy_budget=accuracy_budget,
            holdout_samples=holdout,
        )
        graph = make_precision_graph(fp32.path, config, work / f"{name}.onnx", quiet=True)
        seconds = time.perf_counter() - start
        result[name] = _summary(reference, _outputs(str(graph.path), test), test.labels, graph)
        result[name]["conversion_seconds"] = round(seconds, 1)
        if accuracy_budget is not None:
            chosen = graph.report["accuracy_budget"]
            result[name]["quantized_nodes"] = chosen["quantized_nodes"]
            result[name]["kept_float"] = chosen["kept_float"]
            result[name]["holdout_exact"] = {"fp32": chosen["fp32_exact"], "nvfp4": chosen["nvfp4_exact"]}
            result[name]["layer_loss_points"] = {k: round(v, 2) for k, v in chosen["layer_loss_points"].items()}
        print(name, json.dumps(result[name]), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--test-puzzles", type=int, default=1000)
    parser.add_argument("--calib-samples", type=int, default=128)
    parser.add_argument("--budget", type=float, default=1.0, help="accuracy budget in points for the second graph")
    parser.add_argument("--holdout", type=int, default=256, help="puzzles the budget is measured on")
    parser.add_argument("--out", default="benchmarks/results/nvfp4_accuracy.json")
    args = parser.parse_args()
    report: dict = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average_at_start": os.getloadavg()}
    }
    import onnxruntime

    report["onnxruntime"] = onnxruntime.__version__
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        report["bundled"] = measure(Path(tmp), args.test_puzzles, args.calib_samples, args.budget, args.holdout)
    report["machine"]["load_average_at_end"] = os.getloadavg()
    report["seconds"] = round(time.perf_counter() - start, 1)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
