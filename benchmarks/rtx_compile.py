"""What TensorRT-RTX's builder settings do to the engine compile of the bundled model's default INT8
build, against one FP32 pass over its holdout measured in the same run.

``build-engine --int8`` (TensorRT-RTX) spends most of its time in the engine compile of the 8-step
unroll, single-threaded on the CPU. Each arm compiles the same INT8 Q/DQ graph (the precision
stage's, written once) through ``hrm-deploy build-engine GRAPH --int8`` in a fresh process, as a user
would, with one change made to the builder's configuration just before ``build_serialized_network``
(everything else as the engine stage's worker sets it, the desktop target's one compute capability,
SM120, included): a ``sitecustomize`` put on the worker's path (``HRM_RTX_ARM``) wraps the call,
applies the arm, times it and records the settings the builder saw. Arms:

* ``default``: as built;
* ``optimization-level-0``: ``builder_optimization_level = 0`` (the worker's default is the target's);
* ``one-tactic``: ``max_num_tactics = 1``;
* ``no-aux-streams``: ``max_aux_streams = 0``;
* ``no-compilation-cache``: ``BuilderFlag.DISABLE_COMPILATION_CACHE``;
* ``layer-names-only``: ``ProfilingVerbosity.LAYER_NAMES_ONLY`` (the worker asks for DETAILED);
* ``all``: every change above at once.

The arms alternate over ``--rounds`` rounds; each gives the compile's seconds (the wrapped call) and
the engine stage's (its manifest), the median over rounds, and the compile in FP32 passes.

    nice python benchmarks/rtx_compile.py                 # the bundled model, 3 rounds
    python benchmarks/rtx_compile.py --model sudoku-tiny --rounds 1 --arms default,all   # smoke

Writes benchmarks/results/rtx_compile.json (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# sitecustomize for the build's processes: wraps Builder.build_serialized_network (the worker's one
# compile call) to apply the arm named by HRM_RTX_ARM and append its seconds to HRM_RTX_TIMES
SITECUSTOMIZE = """
import os
if os.environ.get("HRM_RTX_ARM"):
    import json, time
    import tensorrt_rtx as trt

    def _arm(config, arm):
        if arm in ("optimization-level-0", "all"):
            config.builder_optimization_level = 0
        if arm in ("one-tactic", "all"):
            config.max_num_tactics = 1
        if arm in ("no-aux-streams", "all"):
            config.max_aux_streams = 0
        if arm in ("no-compilation-cache", "all"):
            config.set_flag(trt.BuilderFlag.DISABLE_COMPILATION_CACHE)
        if arm in ("layer-names-only", "all"):
            config.profiling_verbosity = trt.ProfilingVerbosity.LAYER_NAMES_ONLY

    _compile = trt.Builder.build_serialized_network

    def _timed(self, network, config):
        _arm(config, os.environ["HRM_RTX_ARM"])
        start = time.perf_counter()
        plan = _compile(self, network, config)
        seconds = time.perf_counter() - start
        with open(os.environ["HRM_RTX_TIMES"], "a") as out:
            settings = {  # what the builder compiled with: the arm's change seen on the config
                "builder_optimization_level": config.builder_optimization_level,
                "max_num_tactics": config.max_num_tactics,
                "max_aux_streams": config.max_aux_streams,
                "compilation_cache": not config.get_flag(trt.BuilderFlag.DISABLE_COMPILATION_CACHE),
                "avg_timing_iterations": config.avg_timing_iterations,
                "compute_capability": str(config.get_compute_capability(0)).rsplit(".", 1)[-1],
                "profiling_verbosity": str(config.profiling_verbosity).rsplit(".", 1)[-1],
            }
            out.write(json.dumps({"arm": os.environ["HRM_RTX_ARM"], "seconds": seconds, "settings": settings}) + "\\n")
        return plan

    trt.Builder.build_serialized_network = _timed
"""
ARMS = (
    "default",
    "optimization-level-0",
    "one-tactic",
    "no-aux-streams",
    "no-compilation-cache",
    "layer-names-only",
    "all",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="sudoku-small", help="a bundled model (sudoku-small, sudoku-tiny)")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated: {', '.join(ARMS)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rtx_compile.json"))
    args = parser.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not arms or any(a not in ARMS for a in arms):
        raise SystemExit(f"arms are {', '.join(ARMS)} (got {args.arms})")
    from int8_build_time import fp32_pass, hrm, machine  # the build-time rows' pass and machine record

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        hrm("export", "--model", args.model, "-o", "model.onnx", "--no-parity", cwd=work)
        hrm("build-engine", "model.onnx", "--int8", "-o", "first.engine", cwd=work)  # writes model.int8.onnx
        record = json.loads((work / "model.int8.onnx.manifest.json").read_text())
        recipe = record.get("recipe") or record["report"]
        puzzles = int(recipe["accuracy"]["measured"]["holdout_puzzles"])

        # this VM's pass swings between two speeds from one minute to the next (1.6 or 2.7-2.8 s on the
        # bundled model, its CPU seconds with it): timed before and after the arms (each the median
        # of three), their mean kept
        def one_pass() -> float:
            return fp32_pass(work / "model.onnx", recipe["calibration"]["data"], puzzles, recipe["calibration"])[0]

        passes = [one_pass()]
        site = work / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        times = work / "times.jsonl"
        paths = os.pathsep.join(p for p in (str(site), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        rows: dict[str, dict[str, list[float]]] = {arm: {"compile": [], "stage": []} for arm in arms}
        settings: dict[str, Any] = {}
        for round_ in range(max(1, args.rounds)):
            for arm in arms if round_ % 2 == 0 else arms[::-1]:  # alternating: drift spreads over arms
                env = {**os.environ, "HRM_RTX_ARM": arm, "HRM_RTX_TIMES": str(times), "PYTHONPATH": paths}
                hrm("build-engine", "model.int8.onnx", "--int8", "-o", f"{arm}.engine", cwd=work, env=env)
                stage = json.loads((work / f"{arm}.engine.manifest.json").read_text())["timings"]
                rows[arm]["stage"].append(float(sum(stage.values())))
                compiled = [json.loads(line) for line in times.read_text().splitlines()]
                rows[arm]["compile"].append(float(compiled[-1]["seconds"]))
                settings[arm] = compiled[-1]["settings"]
                print(f"{arm}: compile {compiled[-1]['seconds']:.1f} s", flush=True)
        passes.append(one_pass())
    fp32 = statistics.median(passes)
    report: dict[str, Any] = {
        "machine": machine(),
        "model": args.model,
        "graph": "the precision stage's INT8 Q/DQ graph of the default export (the unroll)",
        "fp32_pass_seconds": round(fp32, 3),
        "fp32_passes_before_and_after": [round(p, 3) for p in passes],
        "fp32_pass_puzzles": puzzles,
        "rounds": max(1, args.rounds),
        "arms": {
            arm: {
                "compile_seconds": [round(s, 2) for s in row["compile"]],
                "stage_seconds": [round(s, 2) for s in row["stage"]],
                "median_compile_seconds": round(statistics.median(row["compile"]), 2),
                "compile_in_fp32_passes": round(statistics.median(row["compile"]) / fp32, 2),
                "settings": settings[arm],
            }
            for arm, row in rows.items()
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for arm, row in report["arms"].items():
        print(f"{arm}: {row['median_compile_seconds']} s = {row['compile_in_fp32_passes']} FP32 passes")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
