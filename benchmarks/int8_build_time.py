"""What a quantized build costs, as a ratio that holds on any machine: its total time over one FP32
pass over the holdout its verdict used.

Each row runs ``hrm-deploy`` in a fresh process, as a user would (calibration cache empty):

* ``bundled-trt``: the bundled model's default ``build-engine --int8`` (its FP32 export, the default
  target: TensorRT-RTX, whose builder runs on CPU; calibration, the accuracy rule and its fallback
  included);
* ``bundled-cpu``: the bundled model's default ``build-engine --int8 --target cpu`` (static INT8);
* ``checkpoint-cpu`` / ``checkpoint-trt``: the same two builds of ``--checkpoint PATH`` (e.g. a
  trained Sudoku-size model: the TensorRT row builds its step graph, as ``build-engine`` chooses),
  calibrated on its own dataset or ``--data``.

A row records the wall time of the build (calibration included), its stage timings and accuracy
record (screens, certifications, the puzzle runs of FP32 and of candidates by kind, the candidate
graphs written), then times one FP32 pass over as many held-out puzzles as the verdict used, in this
process, the way the build runs FP32 (:meth:`hrm_deploy.precision.holdout.Holdout.reference`: the
same runner, its streams and the same run calls), and gives the ratio of the two (goal: <= 3), the
same of the build's stages alone (without the process start, imports and parse: seconds that do not
grow with the model, which dominate a small one), and the ratio of CPU seconds (the build's, every
thread and child process, over the pass's: the work in FP32 passes' worth, whatever the cores), the
least ratio any scheduling of that work could reach on this machine's cores (its CPU seconds spread
over every core all the time), and, where calibration ran on puzzles apart from the holdout, the
ratio to one FP32 pass over those puzzles and the holdout together (the goal's "(calibration
included)" read as part of the pass). A TensorRT row also gives the engine compile's seconds (the
TensorRT-RTX build, in its child process: the same for an FP16 build of the graph, no part of the
verdict) and the ratio without them. ``work`` counts the puzzle runs (calibration, FP32, candidates)
per held-out puzzle: what the build did, whatever the machine's load. The weights a row used are
named with their sha256; the machine's CPU, ISA flags and load average go into the JSON: compare
rows from one machine only.

    nice python benchmarks/int8_build_time.py --repeat 3            # both bundled rows, median of 3
    nice python benchmarks/int8_build_time.py --checkpoint /work/trained/run-full/last.pt \\
        --rows checkpoint-cpu,checkpoint-trt
    python benchmarks/int8_build_time.py --tiny        # smoke: the tiny bundled model, its cpu row

Writes benchmarks/results/int8_build_time.json (``--out``), keeping the rows it did not run (each
with the machine record it was measured on).
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
GOAL_RATIO = 3.0
# a short FP32 pass is timed this many times, the median kept (one pass of the bundled model's 300
# puzzles measured 2.0 to 3.5 s on the same idle 2-core VM); one over STEADY_PASS_SECONDS once
FP32_PASSES = 3
STEADY_PASS_SECONDS = 30.0
ROWS = ("bundled-trt", "bundled-cpu", "checkpoint-cpu", "checkpoint-trt")


def machine() -> dict[str, Any]:
    from hrm_deploy.backends.ort.builder.isa import isa_flags
    from hrm_deploy.bench.profile import cpu_description

    return {"cpu": cpu_description(), "isa": isa_flags(), "cpus": os.cpu_count(), "load_average": os.getloadavg()}


def children_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process's finished children and theirs."""
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def hrm(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[float, float]:
    """Run ``hrm-deploy ARGS`` in ``cwd`` (``env``: its environment, None: this one's); returns its
    wall seconds and CPU seconds (a failure stops the benchmark)."""
    start, cpu = time.perf_counter(), children_cpu_seconds()
    done = subprocess.run([sys.executable, "-m", "hrm_deploy", *args], cwd=cwd, env=env, capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - start, children_cpu_seconds() - cpu
    (cwd / f"{args[0]}.log").write_text(done.stderr)
    if done.returncode:
        raise SystemExit(f"hrm-deploy {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, cpu


def weights(checkpoint: str) -> dict[str, Any]:
    """Which weights a row used: the file, its sha256 and what its own record says of training."""
    from hrm_deploy.io import sha256_file
    from hrm_deploy.model.checkpoint import read_checkpoint

    record: dict[str, Any] = {"checkpoint": checkpoint, "sha256": sha256_file(checkpoint)}
    try:
        contents = read_checkpoint(checkpoint)
    except Exception as exc:  # noqa: BLE001 - an upstream step_N holds no record of ours
        return {**record, "record": f"not ours to read ({type(exc).__name__})"}
    record["trained_steps"] = contents.step
    record["dataset"] = contents.extra.get("dataset") or contents.train_config.get("data_path")
    record["forward_dtype"] = contents.config.forward_dtype  # the precision it trained in
    return record


def fp32_pass(
    export: Path, data: str, puzzles: int, calibration: dict[str, Any], calibrated: int = 0
) -> tuple[float, float, int]:
    """Wall and CPU seconds of one FP32 pass of ``export`` over the ``puzzles`` held-out puzzles its
    verdict used, on ONNX Runtime CPU as the build runs FP32 (the same runner, streams and run calls),
    and the streams: the ratio's denominator (the median of :data:`FP32_PASSES` passes where a pass is
    short). A holdout that is the calibration set (a costly model) starts with its puzzles;
    ``calibrated`` > 0 adds the calibration puzzles apart from the holdout (the first ``calibrated``
    of the train split, as calibration takes them) in front of it."""
    import numpy as np

    from hrm_deploy.data.examples import Examples, load_examples
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.onnx_runtime import load_onnx
    from hrm_deploy.precision.accuracy import GraphRunner
    from hrm_deploy.precision.holdout import Holdout

    shared = min(puzzles, int(calibration["samples"])) if calibration.get("holdout") else 0
    parts = [load_examples(data, calibrated)] if calibrated else []
    if shared:
        parts.append(load_examples(data, shared))
    if puzzles > shared:
        parts.append(load_examples(data, puzzles - shared, split="test"))
    examples = Examples(
        np.concatenate([p.inputs for p in parts]), np.concatenate([p.puzzle_identifiers for p in parts]), None, data, ""
    )
    puzzles += calibrated
    passes = []
    with GraphRunner(graph_metadata(load_onnx(export)), table_of=export) as runner:
        runner(export, load_examples(data, 1, split="test"))  # the session's start, not timed
        for _ in range(FP32_PASSES):
            holdout = Holdout(export, examples, runner, puzzles, puzzles, streams=runner.streams)
            start, cpu = time.perf_counter(), time.process_time()
            holdout.reference(puzzles)
            passes.append((time.perf_counter() - start, time.process_time() - cpu))
            if passes[-1][0] > STEADY_PASS_SECONDS:
                break
    wall, cpu = sorted(passes)[len(passes) // 2]
    return wall, cpu, runner.streams


def built_row(
    name: str,
    work: Path,
    export: Path,
    manifest: Path,
    timed: tuple[float, float],
    used: dict[str, Any],
    engine: Path | None = None,
) -> dict[str, Any]:
    """A row from a finished build: its record, the work it did, and the ratio to one FP32 pass over
    its holdout (``engine``: a TensorRT row's engine manifest, whose compile is given apart).
    ``timed``: the build's wall and CPU seconds."""
    seconds, cpu_seconds = timed
    record = json.loads(manifest.read_text())
    report = record.get("recipe") or record.get("report") or {}
    accuracy = report.get("accuracy") or {}
    calibration = report.get("calibration") or {}
    puzzles = int((accuracy.get("measured") or {}).get("holdout_puzzles") or 0)
    cost = accuracy.get("cost") or {}
    row: dict[str, Any] = {
        "row": name,
        "weights": used,
        "seconds": round(seconds, 2),
        "timings": record.get("timings"),
        "calibration": calibration,
        "accuracy": accuracy,
    }
    if puzzles:
        calibrated = 0 if calibration.get("reused") else int(calibration.get("samples") or 0)
        runs = {
            "calibration_puzzles": calibrated,
            "fp32_puzzle_runs": cost.get("fp32_puzzle_runs"),
            "candidate_puzzle_runs": cost.get("candidate_puzzle_runs"),
            "candidate_puzzle_runs_by_kind": cost.get("candidate_puzzle_runs_by_kind"),
            "candidate_graphs_written": cost.get("candidate_graphs_written"),
        }
        total = calibrated + int(cost.get("fp32_puzzle_runs") or 0) + int(cost.get("candidate_puzzle_runs") or 0)
        runs["puzzle_runs_per_holdout_puzzle"] = round(total / puzzles, 3)
        fp32, fp32_cpu, streams = fp32_pass(export, calibration["data"], puzzles, calibration)
        stages = sum((record.get("timings") or {}).values())
        row.update(
            work=runs,
            fp32_pass_seconds=round(fp32, 3),
            fp32_pass_puzzles=puzzles,
            fp32_pass_streams=streams,
            ratio=round(seconds / fp32, 2),
            goal_ratio=GOAL_RATIO,
            # the same in CPU seconds (every thread and child process): the work the build does in
            # FP32 passes' worth, whatever the cores and their streams
            cpu_seconds=round(cpu_seconds, 2),
            fp32_pass_cpu_seconds=round(fp32_cpu, 3),
            cpu_ratio=round(cpu_seconds / fp32_cpu, 2),
            # the build's stages alone (calibration included; the process start, imports and the
            # export's parse not): what the ratio is once a model's work dwarfs a process start
            stage_seconds=round(stages, 1),
            ratio_of_stages=round(stages / fp32, 2),
            ratio_to_fp32_inside_build=round(seconds / cost["fp32_seconds"], 2) if cost.get("fp32_seconds") else None,
        )
        # the build's CPU seconds spread over every core all the time: the least its wall time could
        # be however its work were scheduled, in FP32 passes
        cores = len(os.sched_getaffinity(0))
        row["ratio_if_every_core_were_busy"] = round(cpu_seconds / cores / fp32, 2)
        apart = 0 if calibration.get("holdout") else calibrated
        if apart:  # the other reading of the goal: its pass over the calibration puzzles too
            with_calibration = fp32_pass(export, calibration["data"], puzzles, calibration, apart)[0]
            row.update(
                fp32_pass_with_calibration_puzzles_seconds=round(with_calibration, 3),
                ratio_with_calibration_puzzles_in_the_pass=round(seconds / with_calibration, 2),
            )
        if engine is not None:
            compile_seconds = float(sum((json.loads(engine.read_text()).get("timings") or {}).values()))
            row.update(
                engine_compile_seconds=round(compile_seconds, 1),
                engine_compile_in_fp32_passes=round(compile_seconds / fp32, 2),
                ratio_without_engine_compile=round((seconds - compile_seconds) / fp32, 2),
            )
    return row


def export_of(work: Path, checkpoint: str | None, tiny: bool) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    source = ["--model", "sudoku-tiny" if tiny else "sudoku-small"] if checkpoint is None else [checkpoint]
    hrm("export", *source, "-o", "model.onnx", "--no-parity", cwd=work)
    return work / "model.onnx"


def run_row(name: str, work: Path, checkpoint: str | None, data: str | None, tiny: bool) -> dict[str, Any]:
    from hrm_deploy.train.presets import bundled_checkpoint

    export = export_of(work, checkpoint, tiny)
    used = weights(checkpoint or bundled_checkpoint("sudoku-tiny" if tiny else "sudoku-small"))
    extra = ["--calib-data", data] if data else []
    if name.endswith("cpu"):
        timed = hrm(
            "build-engine", "model.onnx", "--int8", "--target", "cpu", "-o", "model.int8.cpu.onnx", *extra, cwd=work
        )
        return built_row(name, work, export, work / "model.int8.cpu.onnx.manifest.json", timed, used)
    timed = hrm("build-engine", "model.onnx", "--int8", "-o", "model.int8.engine", *extra, cwd=work)
    precision = sorted(work.glob("*.int8.onnx.manifest.json"))  # the precision stage's graph (unroll or step)
    step = sorted(work.glob("*.step.onnx"))
    engine = work / "model.int8.engine.manifest.json"
    return built_row(name, work, step[0] if step else export, precision[0], timed, used, engine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="bundled-trt,bundled-cpu", help=f"comma-separated: {', '.join(ROWS)}")
    parser.add_argument("--checkpoint", help="a checkpoint (ours or upstream step_N) for the checkpoint-* rows")
    parser.add_argument("--data", help="calibration data of the checkpoint rows (default: its own dataset)")
    parser.add_argument("--tiny", action="store_true", help="smoke run: the tiny bundled model, its cpu row")
    parser.add_argument(
        "--repeat", type=int, default=1, help="builds per row (fresh caches each); the row is the median ratio's"
    )
    parser.add_argument("--work", default="/tmp/hrm-int8-build-time")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "int8_build_time.json"))
    args = parser.parse_args()
    rows = ["bundled-cpu"] if args.tiny else [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown or (any(r.startswith("checkpoint") for r in rows) and not args.checkpoint):
        raise SystemExit(f"rows are {', '.join(ROWS)}; the checkpoint rows need --checkpoint (got {rows})")
    work = Path(args.work)
    for name in ("checkpoint", "data"):  # the builds run in their own folders: paths made absolute
        value = getattr(args, name)
        if value and not value.startswith("hf:") and Path(value).exists():
            setattr(args, name, str(Path(value).resolve()))
    report: dict[str, Any] = {"machine": machine(), "rows": []}
    for name in rows:
        checkpoint = args.checkpoint if name.startswith("checkpoint") else None
        data = args.data if checkpoint else None
        runs = []
        for index in range(max(1, args.repeat)):
            runs.append(run_row(name, work / name / str(index), checkpoint, data, args.tiny))
            runs[-1]["machine"] = machine()  # each build's own load average
        runs.sort(key=lambda run: run.get("ratio") or 0.0)
        row = runs[len(runs) // 2]  # the median build (the upper one of an even count)
        if len(runs) > 1:
            row["repeats"] = [{"seconds": run["seconds"], "ratio": run.get("ratio")} for run in runs]
        report["rows"].append(row)
    report["machine"]["load_average_end"] = os.getloadavg()
    out = Path(args.out)
    if out.is_file() and not args.tiny:  # rows not run this time are kept, each with its machine record
        before = json.loads(out.read_text())
        ran = {row["row"] for row in report["rows"]}
        kept = [{"machine": before.get("machine"), **r} for r in before.get("rows", []) if r.get("row") not in ran]
        report["rows"] = sorted(report["rows"] + kept, key=lambda r: ROWS.index(r["row"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for row in report["rows"]:
        compile_words = ""
        if "engine_compile_seconds" in row:
            compile_words = (
                f"; {row['ratio_without_engine_compile']} x without the engine compile "
                f"({row['engine_compile_seconds']} s = {row['engine_compile_in_fp32_passes']} FP32 passes)"
            )
        print(
            f"{row['row']}: {row['seconds']} s, {row.get('ratio')} x one FP32 pass over its holdout (goal {GOAL_RATIO})"
            f"{compile_words}; {row.get('cpu_ratio')} x its CPU seconds; "
            f"{(row.get('work') or {}).get('puzzle_runs_per_holdout_puzzle')} puzzle runs per held-out puzzle"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
