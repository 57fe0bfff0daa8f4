"""TensorRT-RTX build time, peak host memory and layer counts of the Sudoku-size model (random
weights, 16 ACT steps), FP16 and INT8, single-step and unrolled, from the folded exports
(shape arithmetic folded out of the traced segment before the unroll is assembled).

Goals (issue 13): single-step <= 1 min and <= 2 GB; unrolled <= 3 min and <= 4 GB.
Builds run in the engine stage's child process, which reports its own wall time and peak RSS.

    nice python benchmarks/trt_build_cost.py [--only step] [--out benchmarks/results/trt_build_cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="step,step-unfolded,unrolled")
    parser.add_argument("--precisions", default="fp16,int8")
    parser.add_argument("--out", default="benchmarks/results/trt_build_cost.json")
    args = parser.parse_args()
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.model.hrm import build_model
    from hrm_deploy.train.presets import preset

    config = HRMConfig(seq_len=81, vocab_size=11, num_puzzle_identifiers=1,
                       **{**preset("sudoku")["model"], "forward_dtype": "float32"})
    model = build_model(config, seed=0)
    report: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                "load_average_at_start": os.getloadavg()},
                    "goals": {"step": {"seconds": 60, "peak_mib": 2048}, "unrolled": {"seconds": 180, "peak_mib": 4096}},
                    "builds": {}}
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.chdir(work)  # the precision stage's calib/ cache goes here, not into the checkout
        generate_sudoku(SudokuSpec(train=16, test=8, blanks=(40, 50), seed=0), str(work / "data"))
        for kind in args.only.split(","):
            mode = "unrolled" if kind == "unrolled" else "step"
            export = export_onnx(model, work / f"{kind}.onnx",
                                 ExportConfig(mode=mode, parity=False, fold=kind != "step-unfolded"), quiet=True)
            for precision in args.precisions.split(","):
                if kind == "step-unfolded" and precision != "fp16":
                    continue
                start = time.perf_counter()
                result = build_engine(export.path, EngineConfig(
                    precision, target="desktop", backend="tensorrt-rtx", calib_data=str(work / "data"),
                    calib_method="minmax", calib_samples=16, max_batch=64, timing_cache=None),
                    out=work / f"{kind}.{precision}.engine", quiet=True)
                build = result.build
                network = build.get("network", {})
                entry = {"onnx_nodes": export.nodes, "folding": export.folding,
                         "build_seconds": build.get("build_seconds"), "peak_host_mib": build.get("peak_host_mib"),
                         "engine_mib": round(build.get("engine_bytes", 0) / 2**20, 1),
                         "network_layers": network.get("layers"), "layer_output_dtypes": network.get("output_dtypes"),
                         "stage_seconds_total": round(time.perf_counter() - start, 1)}
                report["builds"][f"{kind}/{precision}"] = entry
                print(kind, precision, {k: entry[k] for k in ("build_seconds", "peak_host_mib", "network_layers")},
                      flush=True)
                out.write_text(json.dumps(report, indent=2) + "\n")
                (work / f"{kind}.{precision}.engine").unlink(missing_ok=True)
    report["machine"]["load_average_at_end"] = os.getloadavg()
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
