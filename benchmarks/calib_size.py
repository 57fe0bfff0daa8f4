"""INT8 calibration: accuracy against calibration size K and method, and what range collection
costs over plain inference of the same samples.

* Bundled trained ``sudoku-tiny``: TensorRT-convention Q/DQ graph (``make_precision_graph``)
  for K in 32..512 and entropy / minmax / percentile; exact accuracy on 500 held-out puzzles
  of its difficulty on ONNX Runtime CPU (which executes Q/DQ faithfully), calibration seconds.
* Sudoku-size (random weights, 16 ACT steps, the single-step graph as built for Jetson and
  the unrolled graph): seconds of range collection vs plain ORT inference of the same K samples,
  per sample, to extrapolate the default K's calibration time.

    nice python benchmarks/calib_size.py [--sizes 32,64,128,256,512] [--sudoku-k 8]
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


def plain_inference_s(path: Path, examples, batch: int, mode: str, steps: int) -> float:
    """Seconds ORT takes to run the same feeds calibration runs, without collecting ranges."""
    from hrm_deploy.onnx_runtime import ort_session
    from hrm_deploy.precision.int8 import _Reader

    session = ort_session(str(path))
    reader = _Reader(examples, batch, str(path), mode, steps)
    outputs = ["z_H_out", "z_L_out"] if mode == "step" else ["logits"]
    start = time.perf_counter()
    while (feeds := reader.get_next()) is not None:
        session.run(outputs, feeds)
    return time.perf_counter() - start


def collection_s(path: Path, examples, method: str, batch: int, mode: str, steps: int, work: Path) -> float:
    import onnx

    from hrm_deploy.precision.int8 import QuantConfig, _calibrate, plan_nodes

    model = onnx.load(str(path))
    plan = plan_nodes(model, QuantConfig(exclude_patterns=()))
    by_name = {n.name: n for n in model.graph.node}
    tensors = sorted({by_name[n].input[0] for n in plan.quantize})
    del model, by_name
    cache = work / f"ranges-{method}-{mode}.json"
    cache.unlink(missing_ok=True)
    start = time.perf_counter()
    _calibrate(str(path), tensors, examples, QuantConfig(method=method, samples=len(examples), batch=batch), mode,
               steps, cache, None)
    return time.perf_counter() - start


def bundled_sweep(work: Path, sizes: list[int], methods: list[str]) -> dict:
    from hrm_deploy.cli.common import bundled_checkpoint
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.precision.accuracy import onnx_accuracy
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph
    from hrm_deploy.precision.int8 import QuantConfig
    from hrm_deploy.train.presets import preset

    data = work / "tiny-data"
    generate_sudoku(SudokuSpec(train=max(sizes), test=500, blanks=preset("sudoku-tiny")["data"]["blanks"], seed=12345),
                    str(data))
    fp32 = export_onnx(bundled_checkpoint(), work / "tiny.onnx", ExportConfig(parity=False), quiet=True).path
    test = load_examples(str(data), None, split="test")
    result: dict = {"fp32_exact_pct": round(100 * onnx_accuracy(str(fp32), test)["exact_accuracy"], 2),
                    "test_puzzles": len(test), "runs": []}
    for method in methods:
        for k in sizes:
            out = work / f"tiny.{method}.k{k}.int8.onnx"
            start = time.perf_counter()
            make_precision_graph(fp32, PrecisionConfig("int8", calib_data=str(data), cache_dir=str(work / "calib"),
                                                       quant=QuantConfig(method=method, samples=k)), out, quiet=True)
            seconds = time.perf_counter() - start
            exact = round(100 * onnx_accuracy(str(out), test)["exact_accuracy"], 2)
            result["runs"].append({"method": method, "k": k, "exact_pct": exact,
                                   "loss_points": round(result["fp32_exact_pct"] - exact, 2),
                                   "seconds": round(seconds, 2)})
            print("bundled", method, k, exact, round(seconds, 1), flush=True)
    calib = load_examples(str(data), 512)
    plain = plain_inference_s(fp32, calib, 32, "unrolled", 1)
    result["overhead_512"] = {m: round(collection_s(fp32, calib, m, 32, "unrolled", 1, work) / plain - 1, 3)
                              for m in methods}
    result["plain_inference_512_s"] = round(plain, 3)
    return result


def sudoku_timing(work: Path, k: int, methods: list[str]) -> dict:
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.model.hrm import build_model
    from hrm_deploy.train.presets import preset

    config = HRMConfig(seq_len=81, vocab_size=11, num_puzzle_identifiers=1,
                       **{**preset("sudoku")["model"], "forward_dtype": "float32"})
    model = build_model(config, seed=0)
    data = work / "sudoku-data"
    generate_sudoku(SudokuSpec(train=k, test=8, blanks=(40, 50), seed=0), str(data))
    examples = load_examples(str(data), k)
    result: dict = {"k": k, "steps": config.halt_max_steps}
    for mode in ("step", "unrolled"):
        path = export_onnx(model, work / f"sudoku.{mode}.onnx", ExportConfig(mode=mode, parity=False), quiet=True).path
        plain = plain_inference_s(path, examples, 8, mode, config.halt_max_steps)
        entry = {"plain_inference_s": round(plain, 2), "plain_s_per_sample": round(plain / k, 3)}
        for method in methods:
            seconds = collection_s(path, examples, method, 8, mode, config.halt_max_steps, work)
            entry[method] = {"seconds": round(seconds, 2), "overhead": round(seconds / plain - 1, 3),
                             "s_per_sample": round(seconds / k, 3)}
        result[mode] = entry
        print("sudoku", mode, entry, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="32,64,128,256,512")
    parser.add_argument("--methods", default="minmax,entropy,percentile")
    parser.add_argument("--sudoku-k", type=int, default=8)
    parser.add_argument("--skip-sudoku", action="store_true")
    parser.add_argument("--sudoku-methods", default="minmax,entropy")
    parser.add_argument("--out", default="benchmarks/results/calib_size.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    methods = args.methods.split(",")
    report: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                "load_average_at_start": os.getloadavg()}}
    with tempfile.TemporaryDirectory() as tmp:
        report["bundled"] = bundled_sweep(Path(tmp), sizes, methods)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        if not args.skip_sudoku:
            report["sudoku_size"] = sudoku_timing(Path(tmp), args.sudoku_k, args.sudoku_methods.split(","))
    report["machine"]["load_average_at_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
