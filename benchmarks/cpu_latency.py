"""CPU latency and accuracy of the ``cpu`` target, measured in one run, interleaved.

Two models: the bundled trained ACT model (``sudoku-small``, the embedded default: 8 ACT steps;
accuracy on 500 held-out puzzles of its difficulty) and the Sudoku-size model (hidden 512, 4+4 layers, 2x2 cycles, 16 ACT steps; random
weights, so accuracy is replaced by argmax agreement with PyTorch). Rows, batch 1 and 8:

* ``ort-fp32``: the FP32 export as ONNX Runtime runs it by default (online optimization);
* ``cpu-fp32``: ``build-engine --target cpu --fp32`` (ORT-optimized offline);
* ``cpu-int8``: ``build-engine --target cpu --int8`` (dynamic INT8, integer GEMMs);
* ``cpu-fp32-unfused`` / ``cpu-int8-unfused``: the same with ``--no-fuse`` (attention and RMSNorm
  left as ORT's optimizer leaves them: the fusions' effect, measured in the same run);
* ``cpu-int8-static``: static U8S8 Q/DQ on the weight-MatMul inputs (minmax ranges from our
  range collector), ORT-optimized: the alternative INT8 recipe, for comparison;
* ``qdq-int8-trt``: the TensorRT-convention INT8 Q/DQ graph (what ``--int8`` makes for TensorRT);
* ``torch-eager``: our PyTorch model, float32.

Each timed round gives every runner one block of calls (interleaved), so load from other
processes on a shared machine falls on all rows alike; medians over the rounds. Run it nice'd:

    nice python benchmarks/cpu_latency.py [--rounds 5] [--models bundled,sudoku]
Writes benchmarks/results/cpu_latency.json (+ .md).
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

ACCURACY_PUZZLES = 2000  # bundled model: held-out puzzles for exact accuracy (500 moved 1-2 points between sets)
BLOCK_S = 0.5  # each runner's share of a round: calls until this long (one call for the Sudoku-size model)


def _static_u8s8(fp32: Path, out: Path, data: str, samples: int, work: Path) -> Path:
    """Static U8S8 Q/DQ on the weight MatMuls' inputs (ranges: our minmax collector), then
    ORT-optimized offline (DQ->MatMul becomes MatMulIntegerToFloat / QLinearMatMul)."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.engines.cpu import _restore_metadata, fuse_checked, optimize_offline
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.onnx_runtime import quiet_ort
    from hrm_deploy.precision.int8 import QuantConfig, _calibrate, plan_nodes

    model = onnx.load(str(fp32))
    meta = graph_metadata(model)
    props = {p.key: p.value for p in model.metadata_props}
    plan = plan_nodes(model, QuantConfig())
    by_name = {n.name: n for n in model.graph.node}
    tensors = sorted({by_name[n].input[0] for n in plan.quantize})
    del model, by_name
    examples = load_examples(data, samples)
    cache = work / "static.cache.json"
    quant = QuantConfig(method="minmax", samples=samples, batch=4)
    _calibrate(str(fp32), tensors, examples, quant, meta["mode"], meta["steps"], cache, None)
    qdq = work / "static.qdq.onnx"
    with quiet_ort():
        quantize_static(str(fp32), str(qdq), None, quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        nodes_to_quantize=plan.quantize, op_types_to_quantize=["MatMul"],
                        calibrate_method=CalibrationMethod.MinMax, calibration_cache_path=str(cache),
                        extra_options={"OpTypesToExcludeOutputQuantization": ["MatMul", "Gemm"]})
    optimize_offline(str(qdq), str(out), None)
    fuse_checked(out, meta, None)
    _restore_metadata(out, props, "int8")
    return out


def prepare(name: str, work: Path, calib_samples: int, threads: int | None) -> dict:
    """Checkpoint, data, FP32 export and the CPU graphs of one model; build times recorded."""
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.engines.cpu import CpuBuildConfig, build_cpu
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph
    from hrm_deploy.precision.int8 import QuantConfig
    from hrm_deploy.train.presets import DEFAULT_PRESET, bundled_checkpoint, preset
    from sudoku_size import sudoku_size_model

    folder = work / name
    folder.mkdir()
    if name == "bundled":
        ckpt = bundled_checkpoint(DEFAULT_PRESET)
        blanks = preset(DEFAULT_PRESET)["data"]["blanks"]
        generate_sudoku(SudokuSpec(train=256, test=ACCURACY_PUZZLES, blanks=blanks, seed=12345), str(folder / "data"))
    else:
        ckpt = save_checkpoint(folder / "sudoku-random.pt", sudoku_size_model(seed=0))
        generate_sudoku(SudokuSpec(train=64, test=64, blanks=(40, 50), seed=0), str(folder / "data"))
    data = str(folder / "data")
    timings = {}
    start = time.perf_counter()
    fp32 = export_onnx(str(ckpt), folder / "model.onnx", ExportConfig(parity=False), quiet=True).path
    timings["export_s"] = time.perf_counter() - start
    graphs = {"ort-fp32": fp32}
    for precision in ("fp32", "int8"):
        for fuse, suffix in ((True, ""), (False, "-unfused")):
            start = time.perf_counter()
            graphs[f"cpu-{precision}{suffix}"] = build_cpu(
                fp32, CpuBuildConfig(precision, threads, fuse=fuse),
                folder / f"model.{precision}{suffix}.cpu.ort.onnx", quiet=True).path
            timings[f"cpu_{precision}{suffix.replace('-', '_')}_build_s"] = time.perf_counter() - start
    start = time.perf_counter()
    graphs["cpu-int8-static"] = _static_u8s8(fp32, folder / "model.int8s.cpu.ort.onnx", data, calib_samples, folder)
    timings["cpu_int8_static_build_s"] = time.perf_counter() - start
    if name == "bundled":  # 4.9x slower than FP32 at Sudoku size (cpu_latency_sudoku.json): not re-timed there
        start = time.perf_counter()
        graphs["qdq-int8-trt"] = make_precision_graph(
            fp32, PrecisionConfig("int8", calib_data=data, cache_dir=str(folder),
                                  quant=QuantConfig(method="minmax", samples=calib_samples, batch=4)), quiet=True).path
        timings["qdq_int8_build_s"] = time.perf_counter() - start
    else:  # same compute as cpu-fp32 (ORT optimizes online); only its session start is of interest
        del graphs["ort-fp32"]
    return {"checkpoint": ckpt, "data": data, "graphs": graphs, "timings": timings}


def measure(name: str, prepared: dict, batches: tuple[int, ...], rounds: int, accuracy_n: int,
            threads: int | None) -> dict:
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.metrics import accuracy
    from hrm_deploy.runners import open_runner
    from hrm_deploy.runners.infer import predict
    from hrm_deploy.runners.torch_ref import TorchRunner

    runners = {}
    start_s = {}
    for row, path in prepared["graphs"].items():
        runner = open_runner(path, threads=threads)
        t = time.perf_counter()
        runner.activate()
        start_s[row] = time.perf_counter() - t
        runners[row] = runner
    runners["torch-eager"] = TorchRunner(prepared["checkpoint"])
    runners["torch-eager"].activate()
    examples = load_examples(prepared["data"], None, split="test")
    result: dict = {"session_start_s": start_s, "latency_ms_per_call": {}, "ratios": {}}
    for batch in batches:
        feeds = examples.feeds(0, batch)
        for r in runners.values():  # warm-up
            r.infer(feeds)
        times: dict[str, list[float]] = {row: [] for row in runners}
        for _ in range(rounds):
            for row, r in runners.items():
                # A pause lets the previous runner's spinning worker threads (ORT's pool, torch's
                # OpenMP) go idle; then a block of calls of at least BLOCK_S, block median kept.
                time.sleep(0.2)
                block: list[float] = []
                began = time.perf_counter()
                while not block or (time.perf_counter() - began < BLOCK_S and len(block) < 50):
                    t = time.perf_counter()
                    r.infer(feeds)
                    block.append((time.perf_counter() - t) * 1000)
                times[row].append(statistics.median(block))
        med = {row: statistics.median(v) for row, v in times.items()}
        result["latency_ms_per_call"][str(batch)] = {row: {"median": round(m, 2), "all": [round(x, 1) for x in times[row]]}
                                                    for row, m in med.items()}

        def speedup(slow: str, fast: str) -> float:
            """Median over rounds of slow/fast within the round: the shared machine's slow phases
            (all rows 1.7-2x slower for seconds at a time) fall on both sides of each ratio."""
            return round(statistics.median(a / b for a, b in zip(times[slow], times[fast], strict=True)), 3)

        result["ratios"][str(batch)] = {
            "cpu_int8_speedup_vs_cpu_fp32": speedup("cpu-fp32", "cpu-int8"),
            "cpu_int8_static_speedup_vs_cpu_fp32": speedup("cpu-fp32", "cpu-int8-static"),
            "cpu_fp32_speedup_vs_torch_eager": speedup("torch-eager", "cpu-fp32"),
            "fused_fp32_speedup_vs_unfused": speedup("cpu-fp32-unfused", "cpu-fp32"),
            "fused_int8_speedup_vs_unfused": speedup("cpu-int8-unfused", "cpu-int8"),
            "cpu_int8_speedup_vs_unfused_fp32": speedup("cpu-fp32-unfused", "cpu-int8"),
        }
        for row, key in (("qdq-int8-trt", "qdq_trt_int8_speedup_vs_cpu_fp32"),
                         ("ort-fp32", "ort_fp32_export_speedup_vs_cpu_fp32")):
            if row in med:
                result["ratios"][str(batch)][key] = speedup("cpu-fp32", row)
        print(name, batch, result["ratios"][str(batch)], flush=True)
    result["profile_us_per_call"] = {
        str(batch): {row: op_profile(prepared["graphs"][row], examples.feeds(0, batch), threads)
                     for row in ("cpu-fp32", "cpu-int8")} for batch in batches}
    acc_examples = load_examples(prepared["data"], accuracy_n, split="test")
    preds = {row: predict(r, acc_examples, batch=64) for row, r in runners.items()}
    if name == "bundled":
        result["exact_accuracy_pct"] = {row: round(100 * accuracy(p, acc_examples.labels)["exact_accuracy"], 2)
                                        for row, p in preds.items()}
        result["accuracy_examples"] = len(acc_examples)
    ref = preds["torch-eager"].argmax(-1)
    result["argmax_agreement_with_torch"] = {row: round(float((p.argmax(-1) == ref).mean()), 5)
                                             for row, p in preds.items()}
    for r in runners.values():
        r.close()
    return result


def op_profile(path: str, feeds: dict, threads: int | None, calls: int = 5) -> dict:
    """ORT's profiler on one graph: kernel microseconds per call by op type (sorted, largest
    first), the node count per call, and the wall time per call under profiling. Shows where a
    call's time goes: GEMMs (MatMul, DynamicQuantizeMatMul...) or the per-node cost of the rest."""
    import collections

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.gettempdir()) / "hrm_cpu_profile")
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    session.run(None, feeds)  # warm-up, profiled too: counted out below
    began = time.perf_counter()
    for _ in range(calls):
        session.run(None, feeds)
    wall = (time.perf_counter() - began) / calls
    trace = Path(session.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    by_op: dict[str, float] = collections.Counter()
    nodes = 0
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"] / (calls + 1)
            nodes += 1
    return {"wall_ms_under_profiling": round(wall * 1000, 2), "nodes": nodes // (calls + 1),
            "kernel_us": {op: round(us) for op, us in sorted(by_op.items(), key=lambda kv: -kv[1])}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="bundled,sudoku")
    parser.add_argument("--calib-samples", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1,
                        help="ORT intra-op and torch threads (1: robust on a shared, oversubscribed machine; 0: default)")
    parser.add_argument("--out", default="benchmarks/results/cpu_latency.json")
    args = parser.parse_args()
    import onnxruntime as ort
    import torch

    threads = args.threads or None
    if threads:
        torch.set_num_threads(threads)

    report: dict = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                "onnxruntime": ort.__version__, "torch": torch.__version__,
                                "torch_threads": torch.get_num_threads(), "ort_intra_op_threads": threads or "default (one per core)",
                                "load_average_at_start": os.getloadavg()},
                    "timing": "median ms per infer call (host in, host out) over interleaved rounds after one warm-up",
                    "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            prepared = prepare(name, Path(tmp), args.calib_samples, threads)
            rounds = args.rounds if name == "sudoku" else max(args.rounds, 20)
            report["models"][name] = {"preparation_s": {k: round(v, 2) for k, v in prepared["timings"].items()},
                                      **measure(name, prepared, (1, 8), rounds,
                                                ACCURACY_PUZZLES if name == "bundled" else 8, threads),
                                      "rounds": rounds}
            Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    report["machine"]["load_average_at_end"] = os.getloadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


def markdown(report: dict) -> str:
    lines = ["| model | batch | row | ms / call (median) | vs cpu-fp32 (median of round ratios) "
             "| exact acc (bundled) / argmax agree (sudoku) |",
             "|---|---|---|---|---|---|"]
    for name, m in report["models"].items():
        for batch, rows in m["latency_ms_per_call"].items():
            base = rows["cpu-fp32"]["all"]
            for row, stats in rows.items():
                quality = m.get("exact_accuracy_pct", {}).get(row)
                quality = f"{quality:.2f} %" if quality is not None else f"{m['argmax_agreement_with_torch'][row]:.4f}"
                ratio = statistics.median(a / b for a, b in zip(base, stats["all"], strict=True))
                lines.append(f"| {name} | {batch} | {row} | {stats['median']:.1f} | {ratio:.2f}x | {quality} |")
    env = report["machine"]
    lines.append(f"\n{env['cpus']} CPUs ({env['platform']}), ONNX Runtime {env['onnxruntime']}, torch {env['torch']}; "
                 f"load average {env['load_average_at_start']} at start (shared machine: ratios within one run count).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

