"""What INT8 range collection costs over plain inference of the same calibration samples.

Both arms run in one process on the same providers (``calibration_provider``), driven by the
calibration's own loop (``drive_examples``: one run per batch of the unrolled graph, ``steps`` runs per
batch of the single-step graph; the collecting arm also reduces each run's outputs as
calibration does, ``RangeCollector``), and they alternate run by run (ABBA order), so a shared
machine's load falls on both alike. Reported per graph: session setup of each arm (plain: the
session over the FP32 file; collection: load, add the range outputs, session), run seconds,
the median of the run-by-run ratios, and the overhead with setup included, also extrapolated
to the default K (setup once, runs scaling with K).

* Sudoku-size model (random weights, 16 ACT steps), single-step and unrolled graphs, small K;
* the bundled ACT model (``DEFAULT_PRESET``, 8 steps), both graphs, the default K, minmax and
  entropy (histograms of the activations copied out of ORT);
* with ``--default-total``: the whole default INT8 conversion (K=128 minmax) of the Sudoku-size
  single-step graph, wall seconds (the goal: <= 5 minutes on 2 cores).

    nice python benchmarks/calib_overhead.py [--sudoku-k 8] [--default-total]
Writes benchmarks/results/calib_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path


def _timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def _tensors(path: Path) -> list[str]:
    import onnx

    from hrm_deploy.precision.calibrate import QuantConfig, plan_nodes

    model = onnx.load(str(path), load_external_data=False)
    plan = plan_nodes(model, QuantConfig(exclude_patterns=()))
    by_name = {n.name: n for n in model.graph.node}
    return sorted({by_name[n].input[0] for n in plan.quantize})


def paired(path: Path, examples, batch: int, rounds: int = 1, method: str = "minmax", default_k: int = 128) -> dict:
    """Plain inference vs range collection of ``examples`` (``rounds`` passes) through ``path``, run by run."""
    import onnx

    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.onnx_runtime import ort_session
    from hrm_deploy.precision.calibrate import (
        QuantConfig,
        RangeCollector,
        batch_runs,
        calibration_provider,
        drive_examples,
        range_session,
    )

    meta = graph_metadata(onnx.load(str(path), load_external_data=False))
    mode, steps = meta["mode"], meta["steps"]
    tensors = _tensors(path)

    def plain_session():
        return ort_session(str(path), provider=calibration_provider(), allow_fallback=True)

    plain, plain_setup, _ = _timed(plain_session)
    (collect, fetch), collect_setup, _ = _timed(lambda: range_session(onnx.load(str(path)), path, tensors, method))

    def passes(session, outputs, ranges=None):
        for _ in range(rounds):
            for values in drive_examples(session, outputs, examples, batch, mode, steps):
                if ranges is not None:
                    ranges.add(values)  # the per-run reduction (a running max, or histograms)
                yield

    quant = QuantConfig(method=method, samples=len(examples), batch=batch)
    arms = {
        "plain": passes(plain, [] if mode == "step" else ["logits"]),
        "collect": passes(collect, fetch, RangeCollector(tensors, quant)),
    }
    wall: dict[str, list[float]] = {"plain": [], "collect": []}
    cpu: dict[str, list[float]] = {"plain": [], "collect": []}
    runs = batch_runs(examples, batch, mode, steps) * rounds
    for i in range(runs):
        for arm in ("plain", "collect") if i % 4 in (0, 3) else ("collect", "plain"):  # ABBA
            _, w, c = _timed(arms[arm].__next__)
            wall[arm].append(w)
            cpu[arm].append(c)
    k = len(examples) * rounds  # samples run through each arm
    plain_s, collect_s = sum(wall["plain"]), sum(wall["collect"])
    scale = default_k / k
    result = {
        "mode": mode,
        "steps": steps,
        "k": len(examples),
        "rounds": rounds,
        "batch": batch,
        "method": method,
        "tensors": len(tensors),
        "runs_per_arm": runs,
        "providers": plain.get_providers(),
        "setup_s": {"plain": round(plain_setup, 2), "collect": round(collect_setup, 2)},
        "run_s": {"plain": round(plain_s, 2), "collect": round(collect_s, 2)},
        "run_s_per_sample": {"plain": round(plain_s / k, 3), "collect": round(collect_s / k, 3)},
        "cpu_s": {"plain": round(sum(cpu["plain"]), 2), "collect": round(sum(cpu["collect"]), 2)},
        "median_run_ratio": round(statistics.median(c / p for c, p in zip(wall["collect"], wall["plain"])), 3),
        "run_overhead": round(collect_s / plain_s - 1, 3),
        "cpu_overhead": round(sum(cpu["collect"]) / sum(cpu["plain"]) - 1, 3),
        "overhead_with_setup": round((collect_setup + collect_s) / (plain_setup + plain_s) - 1, 3),
        f"overhead_with_setup_at_k{default_k}": round(
            (collect_setup + scale * collect_s) / (plain_setup + scale * plain_s) - 1, 3
        ),
    }
    print(path.name, json.dumps(result), flush=True)
    return result


def sudoku_size(work: Path, k: int, batch: int, rounds: int) -> dict:
    from sudoku_size import sudoku_size_model

    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx

    model = sudoku_size_model(seed=0)
    data = work / "sudoku-data"
    generate_sudoku(SudokuSpec(train=128, test=8, blanks=(40, 50), seed=0), str(data))
    examples = load_examples(str(data), k)
    result: dict = {}
    for mode in ("step", "unrolled"):
        path = export_onnx(model, work / f"sudoku.{mode}.onnx", ExportConfig(mode=mode, parity=False), quiet=True).path
        result[mode] = paired(path, examples, batch, rounds)
    return result


def bundled(work: Path, k: int, batch: int, rounds: int, methods: list[str]) -> dict:
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.train.presets import DEFAULT_PRESET, bundled_checkpoint, preset

    data = work / "bundled-data"
    generate_sudoku(SudokuSpec(train=k, test=8, blanks=preset(DEFAULT_PRESET)["data"]["blanks"], seed=1), str(data))
    examples = load_examples(str(data), k)
    result: dict = {"preset": DEFAULT_PRESET}
    for mode in ("step", "unrolled"):
        out = work / f"bundled.{mode}.onnx"
        path = export_onnx(bundled_checkpoint(), out, ExportConfig(mode=mode, parity=False), quiet=True).path
        result[mode] = {method: paired(path, examples, batch, rounds, method) for method in methods}
    return result


def default_total(work: Path) -> dict:
    """The default INT8 conversion of the Sudoku-size single-step graph, end to end."""
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph

    quant = QuantConfig()
    config = PrecisionConfig("int8", calib_data=str(work / "sudoku-data"), cache_dir=str(work / "calib"))
    result, wall, cpu = _timed(
        lambda: make_precision_graph(work / "sudoku.step.onnx", config, out=work / "sudoku.step.int8.onnx", quiet=True)
    )
    manifest = json.loads(result.manifest.read_text())
    return {
        "method": quant.method,
        "k": result.report["calibration"]["samples"],  # the default: sized by the model's cost
        "batch": quant.batch,
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),  # all threads: on 2 dedicated cores the wall is about cpu_s / 2
        "stage_s": manifest.get("timings"),
        "goal_s": 300,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sudoku-k", type=int, default=8)
    parser.add_argument("--sudoku-batch", type=int, default=4)
    parser.add_argument("--sudoku-rounds", type=int, default=2)
    parser.add_argument("--bundled-k", type=int, default=128)
    parser.add_argument("--bundled-rounds", type=int, default=3)
    parser.add_argument("--bundled-methods", default="minmax,entropy")
    parser.add_argument("--default-total", action="store_true")
    parser.add_argument("--out", default="benchmarks/results/calib_overhead.json")
    args = parser.parse_args()
    report: dict = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_average_at_start": os.getloadavg()}
    }
    out = Path(args.out).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        report["bundled"] = bundled(work, args.bundled_k, 32, args.bundled_rounds, args.bundled_methods.split(","))
        report["sudoku_size"] = sudoku_size(work, args.sudoku_k, args.sudoku_batch, args.sudoku_rounds)
        if args.default_total:
            report["sudoku_size_step_default"] = default_total(work)
    report["machine"]["load_average_at_end"] = os.getloadavg()
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
