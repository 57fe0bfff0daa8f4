"""Wall time of the two INT8 builds the precision pipeline is held to, with the accuracy check on.

* ``bundled``: the bundled model's default ``build-engine --int8`` (its FP32 export, the default
  target: TensorRT-RTX, whose builder runs on CPU; calibration, the accuracy rule and its fallback
  included). Goal: <= 90 s on an idle 2-core machine.
* ``full``: a full-size (Sudoku-size: hidden 512, 16 ACT steps) model's ``build-engine --target cpu
  --int8`` (static INT8, budget included). Goal: <= 5 min. Pass ``--full-checkpoint`` for an
  upstream-trained model (the accuracy rule then means something); without it a random-weight
  Sudoku-size model is built with ``--no-accuracy-check`` (random weights fail any budget) and the
  row says so.

Each row runs ``hrm-deploy`` in a fresh process, as a user would (calibration cache empty), and
records the wall time, the stage timings from the manifest and the accuracy record. The machine's
CPU, ISA flags and load average go into the JSON: compare rows only from the same machine.

    nice python benchmarks/int8_build_time.py [--full-checkpoint PATH] [--rows bundled,full]
    python benchmarks/int8_build_time.py --tiny      # smoke: the tiny bundled model, both rows

Writes benchmarks/results/int8_build_time.json (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def machine() -> dict[str, Any]:
    from hrm_deploy.backends.ort.builder.isa import isa_flags
    from hrm_deploy.bench.profile import cpu_description

    return {"cpu": cpu_description(), "isa": isa_flags(), "cpus": os.cpu_count(), "load_average": os.getloadavg()}


def hrm(*args: str, cwd: Path) -> float:
    """Run ``hrm-deploy ARGS`` in ``cwd``; returns its wall seconds (a failure stops the benchmark)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hrm_deploy", *args], cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"hrm-deploy {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def manifest_of(engines: Path) -> dict[str, Any]:
    manifests = sorted(engines.glob("*.manifest.json"))
    return json.loads(manifests[-1].read_text()) if manifests else {}


def accuracy_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """The accuracy record, wherever the build kept it (the cpu recipe, or the precision graph's report)."""
    return (manifest.get("recipe") or {}).get("accuracy") or (manifest.get("report") or {}).get("accuracy") or {}


def bundled_row(work: Path, model: str) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    hrm("export", "--model", model, "-o", "model.onnx", cwd=work)
    seconds = hrm("build-engine", "model.onnx", "--int8", "-o", "engines/model.int8.engine", cwd=work)
    precision = json.loads((work / "model.int8.onnx.manifest.json").read_text())
    return {
        "row": f"{model}: default build-engine --int8",
        "seconds": round(seconds, 1),
        "goal_seconds": 90,
        "precision_stage_timings": precision.get("timings"),
        "accuracy": precision.get("report", {}).get("accuracy"),
    }


def full_row(work: Path, checkpoint: str | None, tiny: bool) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    extra: list[str] = []
    if checkpoint is None:
        from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

        if tiny:
            from hrm_deploy.train.presets import bundled_checkpoint

            checkpoint, what = bundled_checkpoint("sudoku-tiny"), "bundled sudoku-tiny (smoke)"
        else:
            from load_common import sudoku_size_checkpoint

            checkpoint, what = str(sudoku_size_checkpoint(work)), "random weights, Sudoku size (hidden 512, 16 steps)"
            extra = ["--no-accuracy-check"]
        data = work / "data"
        generate_sudoku(SudokuSpec(train=128, test=64, blanks=(30, 50), seed=7, workers=1), str(data))
        extra += ["--calib-data", str(data)]
    else:
        what = f"{checkpoint} (its own dataset by default)"
    hrm("export", checkpoint, "-o", "model.onnx", "--no-parity", cwd=work)
    seconds = hrm("build-engine", "model.onnx", "--target", "cpu", "--int8", *extra, cwd=work)
    manifest = manifest_of(work / "engines")
    row = {
        "row": "build-engine --target cpu --int8 (static INT8)",
        "model": what,
        "accuracy_check": "--no-accuracy-check" not in extra,
        "seconds": round(seconds, 1),
        "goal_seconds": 300,
        "timings": manifest.get("timings"),
        "calibration": (manifest.get("recipe") or {}).get("calibration"),
        "accuracy": accuracy_of(manifest),
    }
    if "--no-accuracy-check" in extra:
        cost = check_cost(work, manifest)
        row.update(cost, seconds_with_check=round(seconds + cost["check_int8_pass_seconds"], 1))
    return row


def check_cost(work: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """What the accuracy check adds to a build that ran without it, timed here: the INT8 graph on the
    holdout the check would use. A model this costly measures on its calibration set, whose FP32
    answers the calibration pass already gave, so the check is that one INT8 pass (a random-weight
    model fails any budget, which would time the fallback's search instead of the check)."""
    from hrm_deploy.backends.ort.builder.static import ort_run
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.onnx_runtime import load_onnx
    from hrm_deploy.precision.accuracy import calibration_size, shares_holdout

    meta = graph_metadata(load_onnx(work / "model.onnx"))
    examples = load_examples(str(work / "data"), calibration_size(meta))
    engine = sorted((work / "engines").glob("*.onnx"))[-1]
    start = time.perf_counter()
    ort_run(work / "model.onnx", None, meta)(engine, examples)
    int8 = time.perf_counter() - start
    return {
        "check_shares_calibration_set": shares_holdout(meta),
        "check_int8_pass_seconds": round(int8, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="bundled,full", help="which rows, comma-separated: bundled, full")
    parser.add_argument("--full-checkpoint", help="a full-size (Sudoku-size) checkpoint or upstream step_N")
    parser.add_argument("--tiny", action="store_true", help="smoke run: the tiny bundled model for both rows")
    parser.add_argument("--work", default="/tmp/hrm-int8-build-time")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "int8_build_time.json"))
    args = parser.parse_args()
    work = Path(args.work)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    report: dict[str, Any] = {"machine": machine(), "rows": []}
    if "bundled" in rows:
        report["rows"].append(bundled_row(work / "bundled", "sudoku-tiny" if args.tiny else "sudoku-small"))
    if "full" in rows:
        report["rows"].append(full_row(work / "full", args.full_checkpoint, args.tiny))
    report["machine"]["load_average_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for row in report["rows"]:
        print(f"{row['row']}: {row['seconds']} s (goal {row['goal_seconds']} s)")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
