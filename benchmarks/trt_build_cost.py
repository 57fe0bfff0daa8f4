"""TensorRT-RTX build time, peak host memory and layer counts of the Sudoku-size model (random
weights, 16 ACT steps), FP16 and INT8, single-step and unrolled, from the folded exports
(shape arithmetic folded out of the traced segment and its static slices exported as gathers
before the unroll is assembled; ``step-unfolded`` is the segment as traced).

Goals: single-step <= 1 min and <= 2 GB; unrolled <= 3 min and <= 4 GB.
Builds run in the engine stage's child process, which reports its own wall time and peak RSS.

    nice python benchmarks/trt_build_cost.py [--only step] [--out benchmarks/results/trt_build_cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import json, sys
from hrm_deploy.backends.tensorrt.builder.options import TensorRTOptions
from hrm_deploy.engines.build import EngineConfig, build_engine
graph, precision, engine, result = sys.argv[1:5]
options = TensorRTOptions(timing_cache=None, allow_unrolled=True)
r = build_engine(graph, EngineConfig(precision, target="desktop", backend="tensorrt-rtx", max_batch=64,
                                     options=options), out=engine, quiet=True)
json.dump(r.build, open(result, "w"))
"""


def build_in_child(graph: Path, precision: str, work: Path) -> dict:
    """Build in a fresh small process: the engine stage's worker reports its peak RSS, and on
    Linux a process's maximum RSS carries over from its parent across fork+exec, so the
    parent must not be the large process that exported and calibrated."""
    engine, result = work / "m.engine", work / "build.json"
    start = time.perf_counter()
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(graph), precision, str(engine), str(result)],
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode != 0:
        return {"error": child.stderr.strip().splitlines()[-3:]}
    build = json.loads(result.read_text())
    engine.unlink(missing_ok=True)
    network = build.get("network", {})
    return {
        "build_seconds": build.get("build_seconds"),
        "peak_host_mib": build.get("peak_host_mib"),
        "engine_mib": round(build.get("engine_bytes", 0) / 2**20, 1),
        "network_layers": network.get("layers"),
        "layer_output_dtypes": network.get("output_dtypes"),
        "stage_seconds_total": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="step,step-unfolded,unrolled")
    parser.add_argument("--precisions", default="fp16,int8")
    parser.add_argument("--out", default="benchmarks/results/trt_build_cost.json")
    args = parser.parse_args()
    from sudoku_size import sudoku_size_model

    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph

    model = sudoku_size_model(seed=0)
    out = Path(args.out).resolve()
    previous = json.loads(out.read_text())["builds"] if out.is_file() else {}
    report: dict = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average_at_start": os.getloadavg()},
        "goals": {"step": {"seconds": 60, "peak_mib": 2048}, "unrolled": {"seconds": 180, "peak_mib": 4096}},
        "builds": previous,
    }  # a partial re-run (--only) keeps the other entries
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.chdir(work)  # the precision stage's calib/ cache goes here, not into the checkout
        generate_sudoku(SudokuSpec(train=16, test=8, blanks=(40, 50), seed=0), str(work / "data"))
        for kind in args.only.split(","):
            mode = "unrolled" if kind == "unrolled" else "step"
            export = export_onnx(
                model,
                work / f"{kind}.onnx",
                ExportConfig(mode=mode, parity=False, fold=kind != "step-unfolded"),
                quiet=True,
            )
            for precision in args.precisions.split(","):
                if kind == "step-unfolded" and precision != "fp16":
                    continue
                graph = export.path
                if precision != "fp32":
                    graph = make_precision_graph(
                        export.path,
                        PrecisionConfig(
                            precision,
                            calib_data=str(work / "data"),
                            quant=QuantConfig(method="minmax", samples=16, batch=8),
                        ),
                        quiet=True,
                    ).path
                # each entry keeps its own load: a partial re-run leaves entries measured at other times
                entry = {
                    "onnx_nodes": export.nodes,
                    "folding": export.folding,
                    "load_average_at_start": os.getloadavg(),
                    **build_in_child(graph, precision, work),
                }
                report["builds"][f"{kind}/{precision}"] = entry
                print(
                    kind,
                    precision,
                    {k: entry.get(k) for k in ("build_seconds", "peak_host_mib", "network_layers")},
                    flush=True,
                )
                out.write_text(json.dumps(report, indent=2) + "\n")
    report["machine"]["load_average_at_end"] = os.getloadavg()
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
