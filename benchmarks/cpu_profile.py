"""Where the CPU engine's time goes, what each INT8 recipe and session setting buys, and how time
grows with the batch and the ACT steps: one command, one run per model, rows interleaved.

    nice python benchmarks/cpu_profile.py --machine-state idle            # both models, est. 30-45 min
    python benchmarks/cpu_profile.py --machine-state shared --quick       # fewer rounds and rows

Models: ``bundled`` (the trained ``sudoku-small``, 8 ACT steps: accuracy on held-out puzzles)
and ``sudoku`` (``benchmarks/sudoku_size.py``: hidden 512, 4+4 layers, 16 ACT steps, **random
weights**: an upstream-trained Sudoku checkpoint is not available, so this model is for speed
only; argmax agreement on a chaotic random model measures nothing, its static builds skip the
accuracy check). Per model:

1. **kernels**: one GEMM of the model's MLP input projection ([tokens x hidden] @ [hidden x
   2*intermediate]) at batch 1 and 8 as FP32, U8S8 / S8S8 Q/DQ, dynamic, and MatMulNBits 4/8-bit
   (accuracy level 4): what the CPU's integer units give before the model's other work.
2. **recipes**: each built once (in a child process: build seconds and its peak memory), then
   timed at batch 1 and 8 in interleaved rounds (a pause between rows lets the previous row's
   spinning threads go idle); ratios are medians of per-round ratios to FP32 with the same
   session settings. Bundled: exact accuracy and argmax agreement on held-out puzzles the builds
   never saw, and the answers that change when a puzzle runs in a batch of 64 instead of alone.
3. **profile**: ``hrm-deploy profile`` of FP32 and the default INT8 at batch 1 (per-block table,
   JSON, chart, side by side).
4. **scaling**: the step graph (FP32 and static INT8), time per call against batch (1, 8, 64;
   2 ACT steps) and ACT steps (1..16; batch 1), beside the ideal linear cost from the first point.

Every number is stored with the CPU model, its ISA flags (AVX2, AVX-512, VNNI, AMX), the load
average and ``--machine-state`` (``idle`` or ``shared``): compare ratios within one run only.
Writes ``benchmarks/results/cpu_profile_<model>.json`` and ``.md`` (+ the profile and scaling PNGs).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
# row -> (build options, session tuning); "spin-off" rows reuse a build with spinning disabled
RECIPES: dict[str, dict[str, Any]] = {
    "fp32": {"precision": "fp32"},
    "static (default)": {"precision": "int8"},
    "static u8s8": {"precision": "int8", "activations": "uint8"},
    "static s8s8": {"precision": "int8", "activations": "int8"},
    "dynamic": {"precision": "int8", "int8_recipe": "dynamic"},
    "blockwise 8-bit": {"precision": "int8", "int8_recipe": "blockwise"},
}
TUNED = {  # row -> (built row, SessionTuning fields)
    "fp32 spin-off": ("fp32", {"spinning": False}),
    "static spin-off": ("static (default)", {"spinning": False}),
    "static no-arena": ("static (default)", {"arena": False}),
    "static no-mem-pattern": ("static (default)", {"memory_pattern": False}),
}


def machine(state: str) -> dict[str, Any]:
    import onnxruntime

    from hrm_deploy.backends.ort.builder.isa import isa_flags
    from hrm_deploy.bench.profile import cpu_description

    return {
        "state": state,
        "cpu": cpu_description(),
        "isa": isa_flags(),
        "cpus": os.cpu_count(),
        "onnxruntime": onnxruntime.__version__,
        "load_average_start": os.getloadavg(),
    }


def prepare(name: str, folder: Path) -> dict[str, Any]:
    """Checkpoint, data (calibration/holdout and separate held-out puzzles) and both exports."""
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.train.presets import bundled_checkpoint, preset

    folder.mkdir(parents=True, exist_ok=True)
    if name == "bundled":
        ckpt = Path(bundled_checkpoint("sudoku-small"))
        spec = {**preset("sudoku-small")["data"], "augment": 0}
        generate_sudoku(SudokuSpec(**{**spec, "train": 256, "test": 1000, "seed": 12345}), str(folder / "data"))
        generate_sudoku(SudokuSpec(**{**spec, "train": 1, "test": 1000, "seed": 4242}), str(folder / "eval"))
    else:
        from sudoku_size import sudoku_size_model

        ckpt = save_checkpoint(folder / "sudoku-random.pt", sudoku_size_model(seed=0))
        generate_sudoku(SudokuSpec(train=256, test=64, blanks=(40, 50), seed=0), str(folder / "data"))
        generate_sudoku(SudokuSpec(train=1, test=64, blanks=(40, 50), seed=1), str(folder / "eval"))
    unrolled = export_onnx(str(ckpt), folder / "model.onnx", ExportConfig(parity=False), quiet=True).path
    step = export_onnx(str(ckpt), folder / "step.onnx", ExportConfig(mode="step", parity=False), quiet=True).path
    return {"checkpoint": str(ckpt), "unrolled": str(unrolled), "step": str(step), "folder": str(folder)}


def _build_child(src: str, out: str, options: dict[str, Any], queue: Any) -> None:
    from hrm_deploy.backends.ort.builder.cpu import CpuBuildConfig, build_cpu

    start = time.perf_counter()
    built = build_cpu(src, CpuBuildConfig(**options), out, quiet=True)
    manifest = json.loads(built.manifest.read_text())
    queue.put(
        {
            "path": str(built.path),
            "build_s": round(time.perf_counter() - start, 2),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "stages_s": manifest.get("timings"),
            "activations": manifest.get("recipe", {}).get("activations"),
            "accuracy": manifest.get("recipe", {}).get("accuracy"),
        }
    )


def build(src: str, out: Path, options: dict[str, Any]) -> dict[str, Any]:
    """One build in a child process (its own peak memory); the row's build facts."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_build_child, args=(src, str(out), options, queue))
    child.start()
    child.join()
    if child.exitcode != 0:
        raise RuntimeError(f"build of {out.name} failed (exit {child.exitcode})")
    return queue.get()


def build_rows(name: str, prep: dict[str, Any], threads: int, rows: list[str], calib: int) -> dict[str, Any]:
    folder = Path(prep["folder"])
    data = str(folder / "data")
    built: dict[str, Any] = {}
    for row in rows:
        options = {"threads": threads, **RECIPES[row]}
        if options["precision"] == "int8" and options.get("int8_recipe", "static") == "static":
            options.update(calib_data=data, cache_dir=str(folder / "calib"), calib_samples=calib)
            options["check_accuracy"] = name == "bundled"
        slug = row.split(" ")[0] + ("-" + options["activations"] if "activations" in options else "")
        built[row] = build(prep["unrolled"], folder / f"{slug}.cpu.ort.onnx", options)
        print(name, row, f"built in {built[row]['build_s']} s, peak {built[row]['peak_rss_mib']} MiB", flush=True)
    return built


def open_rows(built: dict[str, Any], threads: int, rows: list[str]) -> dict[str, Any]:
    from hrm_deploy.backends import open_runner
    from hrm_deploy.onnx_runtime import SessionTuning

    runners = {}
    for row in rows:
        source, tuning = TUNED.get(row, (row, {}))
        if source in built:
            runners[row] = open_runner(built[source]["path"], threads=threads, tuning=SessionTuning(**tuning))
            runners[row].activate()
    return runners


def time_rounds(runners: dict[str, Any], feeds: dict[str, np.ndarray], rounds: int, block_s: float) -> dict:
    """Median ms per call of each row per round (interleaved, a pause before each row's block of
    calls of at least ``block_s``), after one warm-up call each."""
    for r in runners.values():
        r.infer(feeds)
    from cpu_latency import _time_rows  # the same interleaved rounds as the latency benchmark

    return _time_rows(runners, feeds, rounds, block_s)


def ratios(times: dict[str, list[float]]) -> dict[str, float]:
    """Each row's speed-up: median over rounds of the same-round ratio to FP32 with the same tuning."""
    out = {}
    for row, values in times.items():
        base = times["fp32 spin-off"] if "spin-off" in row and "fp32 spin-off" in times else times["fp32"]
        out[row] = round(statistics.median(a / b for a, b in zip(base, values, strict=True)), 3)
    return out


def accuracy_rows(runners: dict[str, Any], eval_data: str, bundled: bool) -> dict[str, Any]:
    """Exact accuracy and agreement with FP32 on held-out puzzles; answers changed by batching."""
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.metrics import accuracy
    from hrm_deploy.runtime.infer import predict

    examples = load_examples(eval_data, 1000 if bundled else 16, split="test")
    built = {row: r for row, r in runners.items() if row not in TUNED}
    preds = {row: predict(r, examples, batch=64) for row, r in built.items()}
    ref = preds["fp32"].argmax(-1)
    alone_n = 300 if bundled else 16
    result: dict[str, Any] = {"puzzles": len(examples), "batch_dependence_puzzles": alone_n, "rows": {}}
    for row, p in preds.items():
        alone = None
        if row != "fp32":  # one puzzle per call: no batch-mates
            alone = np.concatenate([built[row].infer(examples.feeds(i, i + 1))["logits"] for i in range(alone_n)])
        result["rows"][row] = {
            "exact_pct": round(100 * accuracy(p, examples.labels)["exact_accuracy"], 2) if bundled else None,
            "agreement_pct": round(100 * float((p.argmax(-1) == ref).mean()), 3),
            "changed_by_batching": None
            if alone is None
            else int((alone.argmax(-1) != p[:alone_n].argmax(-1)).any(-1).sum()),
        }
    return result


def kernels(tokens: int, hidden: int, inter: int, threads: int, rounds: int) -> dict[str, Any]:
    """The MLP input projection's GEMM alone, per kernel, at batch 1 and 8 (ms, and x FP32)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from hrm_deploy.backends.ort.builder.isa import qdq_matmul_graph, time_sessions
    from hrm_deploy.onnx_runtime import ort_session, quiet_ort

    n = 2 * inter
    result: dict[str, Any] = {"shape": f"[B*{tokens} x {hidden}] @ [{hidden} x {n}]"}
    for batch in (1, 8):
        m = batch * tokens
        weight = (np.random.default_rng(0).standard_normal((hidden, n)) * 0.05).astype(np.float32)
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "W"], ["y"])],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, hidden])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
            [numpy_helper.from_array(weight, "W")],
        )
        fp32 = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        fp32.ir_version = 9
        graphs = {"fp32": fp32.SerializeToString(), "u8s8": qdq_matmul_graph(m, hidden, n, "uint8")}
        graphs["s8s8"] = qdq_matmul_graph(m, hidden, n, "int8")
        with quiet_ort(), tempfile.TemporaryDirectory() as tmp:
            onnx.save(fp32, f"{tmp}/f.onnx")
            quantize_dynamic(f"{tmp}/f.onnx", f"{tmp}/d.onnx", weight_type=QuantType.QInt8, per_channel=True)
            graphs["dynamic"] = Path(f"{tmp}/d.onnx").read_bytes()
            for bits, block in ((4, 32), (4, 128), (8, 128)):
                q = MatMulNBitsQuantizer(
                    onnx.load_from_string(graphs["fp32"]),
                    bits=bits,
                    block_size=block,
                    is_symmetric=True,
                    accuracy_level=4,
                )
                q.process()
                graphs[f"nbits{bits} b{block}"] = q.model.model.SerializeToString()
        sessions = {k: ort_session(g, threads=threads, spinning=False) for k, g in graphs.items()}
        x = np.random.default_rng(1).standard_normal((m, hidden)).astype(np.float32)
        times = time_sessions(sessions, {"x": x}, rounds, 5)
        result[str(batch)] = {
            k: {
                "ms": round(statistics.median(v), 3),
                "vs_fp32": round(statistics.median(a / b for a, b in zip(times["fp32"], v, strict=True)), 2),
            }
            for k, v in times.items()
        }
        print("kernels b", batch, {k: v["vs_fp32"] for k, v in result[str(batch)].items()}, flush=True)
    return result


def scaling(prep: dict[str, Any], threads: int, calib: int, rounds: int, quick: bool) -> dict[str, Any]:
    """Step graph FP32 and static INT8: ms per call vs batch (2 ACT steps) and vs steps (batch 1)."""
    from hrm_deploy.backends import open_runner
    from hrm_deploy.data.examples import load_examples

    folder = Path(prep["folder"])
    graphs = {
        "fp32": build(prep["step"], folder / "step.fp32.cpu.ort.onnx", {"precision": "fp32", "threads": threads}),
        "static int8": build(
            prep["step"],
            folder / "step.int8.cpu.ort.onnx",
            {
                "precision": "int8",
                "threads": threads,
                "calib_data": str(folder / "data"),
                "cache_dir": str(folder / "calib"),
                "calib_samples": calib,
                "check_accuracy": False,
            },
        ),
    }
    examples = load_examples(str(folder / "data"), 64, split="test")
    batches = (1, 8) if quick else (1, 8, 64)
    steps_list = (1, 2, 4) if quick else (1, 2, 4, 8, 16)
    result: dict[str, Any] = {"batch": {}, "steps": {}, "batch_steps": 2}
    for row, info in graphs.items():
        feeds_of = {b: {k: np.resize(v, (b, *v.shape[1:])) for k, v in examples.feeds(0, 64).items()} for b in batches}
        by_batch, by_steps = {}, {}
        for b in batches:
            with open_runner(info["path"], threads=threads, steps=result["batch_steps"]) as r:
                by_batch[b] = statistics.median(time_rounds({row: r}, feeds_of[b], rounds, 0.5)[row])
        for k in steps_list:
            with open_runner(info["path"], threads=threads, steps=k) as r:
                by_steps[k] = statistics.median(time_rounds({row: r}, feeds_of[1], rounds, 0.5)[row])
        result["batch"][row] = {str(b): round(v, 2) for b, v in by_batch.items()}
        result["steps"][row] = {str(k): round(v, 2) for k, v in by_steps.items()}
        print("scaling", row, result["batch"][row], result["steps"][row], flush=True)
    return result


def plot_scaling(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "batch", "batch (2 ACT steps)"), (axes[1], "steps", "ACT steps (batch 1)")):
        for row, points in result[key].items():
            xs = [int(x) for x in points]
            ys = list(points.values())
            line = ax.plot(xs, ys, marker="o", label=row)[0]
            ax.plot(
                xs,
                [ys[0] * x / xs[0] for x in xs],
                "--",
                color=line.get_color(),
                alpha=0.5,
                label=f"{row}, ideal linear",
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("ms per call")
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_model(name: str, args: argparse.Namespace, results: Path) -> dict[str, Any]:
    import onnx

    from hrm_deploy.bench.profile import ProfileConfig, profile
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.model.families import config_from_dict

    bundled = name == "bundled"
    rounds = (5 if args.quick else 15) if bundled else (1 if args.quick else 3)
    prep = prepare(name, Path(args.work) / name)
    config = config_from_dict(graph_metadata(onnx.load(prep["unrolled"], load_external_data=False))["config"])
    report: dict[str, Any] = {
        "model": name,
        "weights": "trained (bundled sudoku-small)" if bundled else "random (Sudoku-size architecture): speed only",
        "machine": machine(args.machine_state),
        "threads": args.threads,
        "rounds": rounds,
        "calib_samples": args.calib_samples,
    }
    report["kernels"] = kernels(config.total_seq_len, config.hidden_size, config.intermediate_size, args.threads, 5)
    rows = ["fp32", "static (default)", "dynamic"] if args.quick else list(RECIPES)
    report["builds"] = build_rows(name, prep, args.threads, rows, args.calib_samples)
    tuned = ["fp32 spin-off", "static spin-off"] + ([] if args.quick else ["static no-arena", "static no-mem-pattern"])
    runners = open_rows(report["builds"], args.threads, rows + tuned)
    examples = load_examples(str(Path(prep["folder"]) / "eval"), 64, split="test")
    report["latency_ms"], report["speedup_vs_fp32"] = {}, {}
    for batch in (1, 8):
        times = time_rounds(runners, examples.feeds(0, batch), rounds, 0.5 if bundled else 0.0)
        report["latency_ms"][str(batch)] = {row: round(statistics.median(v), 2) for row, v in times.items()}
        report["speedup_vs_fp32"][str(batch)] = ratios(times)
        print(name, "batch", batch, report["speedup_vs_fp32"][str(batch)], flush=True)
    report["accuracy"] = accuracy_rows(runners, str(Path(prep["folder"]) / "eval"), bundled)
    for r in runners.values():
        r.close()
    folder = results / f"cpu_profile_{name}_{args.machine_state}"
    graphs = [report["builds"]["fp32"]["path"], report["builds"]["static (default)"]["path"]]
    profile(
        graphs,
        ProfileConfig(
            data=str(Path(prep["folder"]) / "eval"),
            batch=1,
            calls=1 if args.quick else 3,
            threads=args.threads,
            out_dir=str(folder),
        ),
    )
    report["profile"] = str(folder / "profile.json")
    report["scaling"] = scaling(prep, args.threads, min(args.calib_samples, 16), max(1, rounds // 3), args.quick)
    plot_scaling(report["scaling"], results / f"cpu_profile_{name}_{args.machine_state}_scaling.png")
    report["machine"]["load_average_end"] = os.getloadavg()
    return report


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"# CPU profile: {report['model']} ({report['weights']})",
        "",
        f"Machine ({m['state']}): {m['cpu']}; ONNX Runtime {m['onnxruntime']}, {report['threads']} threads; load "
        f"average {m['load_average_start'][0]:.1f} at start, {m.get('load_average_end', [0])[0]:.1f} at end; "
        f"{report['rounds']} interleaved rounds.",
        "",
        "| row | build s | peak build MiB | b1 ms | b1 vs FP32 | b8 ms | b8 vs FP32 | exact % | agreement % "
        "| changed by batching |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in report["latency_ms"]["1"]:
        b = report["builds"].get(row, {})
        acc = report["accuracy"]["rows"].get(row, {})
        cells = [row, str(b.get("build_s", "-")), str(b.get("peak_rss_mib", "-"))]
        for batch in ("1", "8"):
            cells += [f"{report['latency_ms'][batch][row]:.1f}", f"{report['speedup_vs_fp32'][batch][row]:.2f}x"]
        cells += [
            *(
                "-" if acc.get(k) is None else str(acc[k])
                for k in ("exact_pct", "agreement_pct", "changed_by_batching")
            ),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    k = report["kernels"]
    lines += [
        "",
        f"Kernels, {k['shape']}, x FP32 (b1 / b8): "
        + ", ".join(f"{n} {k['1'][n]['vs_fp32']:.2f}x / {k['8'][n]['vs_fp32']:.2f}x" for n in k["1"]),
    ]
    s = report["scaling"]
    lines += [
        "",
        f"Scaling (step graph, ms per call): vs batch at {s['batch_steps']} ACT steps {s['batch']}; "
        f"vs ACT steps at batch 1 {s['steps']}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--machine-state",
        choices=("idle", "shared"),
        required=True,
        help="recorded with every number: idle (nothing else running) or shared",
    )
    parser.add_argument("--models", default="bundled,sudoku")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calib-samples", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="fewer rows, rounds and scaling points")
    parser.add_argument(
        "--work", default="/tmp/hrm-cpu-profile", help="builds and exports (reused folders are rebuilt)"
    )
    parser.add_argument("--results", default=str(HERE / "results"))
    args = parser.parse_args()
    results = Path(args.results)
    for name in args.models.split(","):
        report = run_model(name, args, results)
        out = results / f"cpu_profile_{name}_{args.machine_state}.json"
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        out.with_suffix(".md").write_text(markdown(report))
        print(markdown(report), flush=True)


if __name__ == "__main__":
    main()
