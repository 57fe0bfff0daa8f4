"""CPU latency of the Sudoku-size model (random weights, 16 ACT steps): ONNX Runtime FP32,
ONNX Runtime INT8 (Q/DQ, minmax calibration) and PyTorch eager FP32, batch 1 and 8, measured
in one run by ``hrm_deploy.bench`` so the ratios compare like with like.

    python benchmarks/cpu_latency.py [--iters 5] [--calib-samples 16]
Writes benchmarks/results/cpu_latency_sudoku.json (+ .md). Accuracy is meaningless on random
weights and is not the point here; latency is.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from hrm_deploy.bench.run import BenchConfig, bench, table
from hrm_deploy.calib.convert import PrecisionConfig, make_precision_graph
from hrm_deploy.calib.int8 import QuantConfig
from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
from hrm_deploy.model.checkpoint import save_checkpoint
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.hrm import build_model
from hrm_deploy.train.presets import preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--calib-samples", type=int, default=16)
    parser.add_argument("--out", default="benchmarks/results/cpu_latency_sudoku.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = HRMConfig(seq_len=81, vocab_size=11, num_puzzle_identifiers=1,
                           **{**preset("sudoku")["model"], "forward_dtype": "float32"})
        ckpt = save_checkpoint(work / "sudoku-random.pt", build_model(config, seed=0))
        generate_sudoku(SudokuSpec(train=64, test=64, blanks=(40, 50), seed=0), str(work / "data"))
        timings = {}
        start = time.perf_counter()
        fp32 = export_onnx(str(ckpt), work / "sudoku.onnx", ExportConfig(parity=False), quiet=True).path
        timings["export_s"] = time.perf_counter() - start
        start = time.perf_counter()
        int8 = make_precision_graph(fp32, PrecisionConfig("int8", calib_data=str(work / "data"), cache_dir=str(work),
                                                          quant=QuantConfig(method="minmax", samples=args.calib_samples,
                                                                            batch=4)), quiet=True).path
        timings["int8_calibration_s"] = time.perf_counter() - start
        report = bench([str(fp32), str(int8)], BenchConfig(data=str(work / "data"), batches=(1, 8), iters=args.iters,
                                                           warmup=1, reference=str(ckpt), accuracy_samples=8,
                                                           out_dir=str(work / "bench")))
    report["preparation"] = timings
    report["note"] = "random weights; 2-core CPU; ORT and torch use all cores"
    report["host"] = {"cpus": os.cpu_count(), "processor": platform.processor()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    out.with_suffix(".md").write_text(table(report))
    print(table(report))


if __name__ == "__main__":
    main()
