"""CPU latency, build time and accuracy of the ``cpu`` target's precisions and recipes, and of
the PyTorch AOTInductor CPU engine in bf16, measured in one run per model, interleaved.

Models: the bundled trained ACT model (``sudoku-small``, the embedded default: 8 ACT steps;
accuracy on held-out puzzles of its difficulty) and the Sudoku-size model
(``benchmarks/sudoku_size.py``: hidden 512, 4+4 layers, 2x2 cycles, 16 ACT steps, random weights).
Rows, each at batch 1 and 8:

* ``cpu-fp32``: ``build-engine --target cpu --fp32``;
* ``cpu-int8-static``: ``--int8`` (the default recipe: calibrated fixed scales, U8S8 integer
  GEMMs, accuracy budget checked at build); on the random-weight Sudoku-size model built with
  ``--no-accuracy-check`` (a chaotic random model's argmax changes under any rounding, so no
  INT8 meets an agreement budget there; the check's cost is estimated from the measured latencies);
* ``cpu-int8-dynamic`` / ``cpu-int8-blockwise``: ``--cpu-int8 dynamic|blockwise``;
* ``torch-bf16``: ``build-engine --backend torch --bf16`` on this CPU (AOTInductor).

Build times include calibration (static) and compilation (torch). Each timed round gives every
row a block of calls (interleaved: load from other processes falls on all rows alike); ratios
are medians of per-round ratios. Accuracy (bundled): exact accuracy and argmax agreement with
cpu-fp32 over every output cell, on held-out puzzles. Run it nice'd, near-idle if possible:

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

ACCURACY_PUZZLES = 1000  # bundled model: held-out puzzles for exact accuracy and agreement
BLOCK_S = 0.5  # each row's share of a round: calls until this long (one call for the Sudoku-size model)
ROWS = ("cpu-fp32", "cpu-int8-static", "cpu-int8-dynamic", "cpu-int8-blockwise", "torch-bf16")


def _reuse(folder: Path, rows: tuple[str, ...]) -> dict:
    graphs, timings = {}, {}
    for row in rows:
        path = folder / f"{row}.cpu.ort.onnx"
        if path.is_file():
            graphs[row] = path
            manifest = json.loads(path.with_name(path.name + ".manifest.json").read_text())
            timings[f"{row}_build_s"] = manifest["build"]["build_seconds"]
    static = json.loads((folder / "cpu-int8-static.cpu.ort.onnx.manifest.json").read_text())
    return {
        "checkpoint": folder / "sudoku-random.pt",
        "data": str(folder / "data"),
        "graphs": graphs,
        "timings": timings,
        "static_recipe": static["recipe"],
        "static_stage_s": static.get("timings"),
        "reused": str(folder),
    }


def prepare(
    name: str, work: Path, threads: int | None, rows: tuple[str, ...], calib_samples: int, reuse: bool = False
) -> dict:
    """Checkpoint, data, FP32 export and every row's artifact; build times recorded."""
    from sudoku_size import sudoku_size_model

    from hrm_deploy.backends.ort.builder.cpu import build_cpu
    from hrm_deploy.backends.ort.builder.options import CpuOptions
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.train.presets import DEFAULT_PRESET, bundled_checkpoint, preset

    folder = work / name
    if reuse:  # a killed run's folder: its artifacts, build times from their manifests
        return _reuse(folder, rows)
    folder.mkdir()
    if name == "bundled":
        ckpt = bundled_checkpoint(DEFAULT_PRESET)
        spec = preset(DEFAULT_PRESET)["data"]
        # calibration + the build's holdout (its test split); the table's accuracy on other puzzles
        generate_sudoku(
            SudokuSpec(**{**spec, "train": 256, "test": 1000, "augment": 0, "seed": 12345}), str(folder / "data")
        )
        generate_sudoku(
            SudokuSpec(**{**spec, "train": 1, "test": ACCURACY_PUZZLES, "augment": 0, "seed": 4242}),
            str(folder / "eval"),
        )
    else:
        ckpt = str(save_checkpoint(folder / "sudoku-random.pt", sudoku_size_model(seed=0)))
        generate_sudoku(SudokuSpec(train=256, test=64, blanks=(40, 50), seed=0), str(folder / "data"))
    data = str(folder / "data")
    evaluation = str(folder / "eval") if name == "bundled" else data
    timings: dict = {}
    start = time.perf_counter()
    fp32 = export_onnx(str(ckpt), folder / "model.onnx", ExportConfig(parity=False), quiet=True).path
    timings["export_s"] = time.perf_counter() - start
    configs = {
        "cpu-fp32": EngineConfig("fp32", target="cpu", options=CpuOptions(threads=threads)),
        "cpu-int8-static": EngineConfig(
            "int8",
            target="cpu",
            calib_data=data,
            calib_cache=str(folder / "calib"),
            calib_samples=calib_samples,
            accuracy_check=name == "bundled",
            options=CpuOptions(threads=threads),
        ),
        "cpu-int8-dynamic": EngineConfig(
            "int8", target="cpu", options=CpuOptions(threads=threads, int8_recipe="dynamic")
        ),
        "cpu-int8-blockwise": EngineConfig(
            "int8", target="cpu", options=CpuOptions(threads=threads, int8_recipe="blockwise")
        ),
    }
    graphs, manifests = {}, {}
    for row, config in configs.items():
        if row not in rows:
            continue
        start = time.perf_counter()
        built = build_cpu(fp32, config, folder / f"{row}.cpu.ort.onnx", quiet=True)
        timings[f"{row}_build_s"] = time.perf_counter() - start
        graphs[row], manifests[row] = built.path, json.loads(built.manifest.read_text())
        print(name, row, f"built in {timings[f'{row}_build_s']:.1f} s", flush=True)
    if "torch-bf16" in rows:
        start = time.perf_counter()
        torch_engine = build_engine(
            fp32, EngineConfig("bf16", backend="torch"), folder / "model.bf16.cpu.torch.pt2", quiet=True
        )
        timings["torch-bf16_build_s"] = time.perf_counter() - start
        graphs["torch-bf16"] = torch_engine.path
        print(name, "torch-bf16", f"built in {timings['torch-bf16_build_s']:.1f} s", flush=True)
    static = manifests["cpu-int8-static"]
    return {
        "checkpoint": ckpt,
        "data": evaluation,
        "graphs": graphs,
        "timings": timings,
        "static_recipe": static["recipe"],
        "static_stage_s": static.get("timings"),
    }


def _time_rows(runners: dict, feeds: dict, rounds: int, block_s: float = BLOCK_S) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {row: [] for row in runners}
    for _ in range(rounds):
        for row, r in runners.items():
            # A pause lets the previous row's spinning worker threads (ORT's pool, torch's
            # OpenMP) go idle; then a block of calls of at least BLOCK_S, block median kept.
            time.sleep(0.2)
            block: list[float] = []
            began = time.perf_counter()
            while not block or (time.perf_counter() - began < block_s and len(block) < 50):
                t = time.perf_counter()
                r.infer(feeds)
                block.append((time.perf_counter() - t) * 1000)
            times[row].append(statistics.median(block))
    return times


def measure(name: str, prepared: dict, batches: tuple[int, ...], rounds: int, threads: int | None) -> dict:
    import numpy as np

    from hrm_deploy.backends import open_runner
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.metrics import accuracy
    from hrm_deploy.registry import runner_options
    from hrm_deploy.runtime.infer import predict

    runners = {}
    for row, path in prepared["graphs"].items():
        runners[row] = open_runner(path, **runner_options(path, threads=threads))
        runners[row].activate()
    examples = load_examples(prepared["data"], None, split="test")
    result: dict = {"latency_ms_per_call": {}, "speedup_vs_cpu_fp32": {}}
    for batch in batches:
        feeds = examples.feeds(0, batch)
        outputs = {row: r.infer(feeds)["logits"] for row, r in runners.items()}  # warm-up
        times = _time_rows(runners, feeds, rounds)
        result["latency_ms_per_call"][str(batch)] = {
            row: {"median": round(statistics.median(v), 2), "all": [round(x, 1) for x in v]} for row, v in times.items()
        }
        result["speedup_vs_cpu_fp32"][str(batch)] = {  # median over rounds of fp32/row within the round
            row: round(statistics.median(a / b for a, b in zip(times["cpu-fp32"], v, strict=True)), 3)
            for row, v in times.items()
        }
        print(name, batch, result["speedup_vs_cpu_fp32"][str(batch)], flush=True)
        if name != "bundled":  # random weights: agreement of the timed batch only, for the record
            ref = outputs["cpu-fp32"].argmax(-1)
            result.setdefault("argmax_agreement_random_weights", {})[str(batch)] = {
                row: round(100 * float((o.argmax(-1) == ref).mean()), 2) for row, o in outputs.items()
            }
    if name == "bundled":
        preds = {row: predict(r, examples, batch=64) for row, r in runners.items()}
        ref = preds["cpu-fp32"].argmax(-1)
        result["accuracy"] = {
            "puzzles": len(examples),
            "exact_accuracy_pct": {
                row: round(100 * accuracy(p, examples.labels)["exact_accuracy"], 2) for row, p in preds.items()
            },
            "argmax_agreement_with_fp32_pct": {
                row: round(100 * float((p.argmax(-1) == ref).mean()), 3) for row, p in preds.items()
            },
        }
        alone = {row: predict(runners[row], examples, batch=1)[:300] for row in ("cpu-int8-static", "cpu-int8-dynamic")}
        result["batch_dependence_300_puzzles"] = {  # alone vs in batches of 64
            row: int((a.argmax(-1) != preds[row][:300].argmax(-1)).any(-1).sum()) for row, a in alone.items()
        }
        del np
    for r in runners.values():
        r.close()
    return result


def check_estimate(model: dict) -> float:
    """Seconds static INT8's accuracy check would add to a Sudoku-size build (skipped there:
    random weights): its holdout (precision.accuracy.MIN_HOLDOUT puzzles) through FP32 and INT8, from
    the batch-8 latencies measured in the same run."""
    from hrm_deploy.precision.accuracy import MIN_HOLDOUT

    lat = model["latency_ms_per_call"]["8"]
    return round(MIN_HOLDOUT / 8 * (lat["cpu-fp32"]["median"] + lat["cpu-int8-static"]["median"]) / 1000, 1)


def _isa() -> list[str]:
    """The instruction-set flags INT8 and BF16 kernels depend on (VNNI: int8 dot products;
    AVX-512-BF16 / AMX: native bf16), as /proc/cpuinfo lists them."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags.split(":", 1)[1].split() if f.startswith(("avx", "amx")) or "vnni" in f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="bundled,sudoku")
    parser.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0: one per core)")
    parser.add_argument("--rows", default=",".join(ROWS), help="rows to build and time (cpu-fp32 always)")
    parser.add_argument("--reuse", help="time the artifacts an interrupted run left in this folder (no builds)")
    parser.add_argument(
        "--calib-samples",
        type=int,
        default=128,
        help="static INT8 calibration examples (128: the build-engine default; its build time)",
    )
    parser.add_argument("--out", default="benchmarks/results/cpu_latency.json")
    args = parser.parse_args()
    import onnxruntime as ort
    import torch

    threads = args.threads or None
    report: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "onnxruntime": ort.__version__,
            "torch": torch.__version__,
            "ort_intra_op_threads": threads or "default (one per core)",
            "isa": _isa(),
        },
        "timing": "median ms per infer call (host in, host out) over interleaved rounds after one warm-up; "
        "speedups: median over rounds of the per-round ratio",
        "models": {},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_file():  # one run per model: the models not measured now keep their last run
        report["models"] = json.loads(out.read_text()).get("models", {})
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.reuse or tmp
        for name in args.models.split(","):
            start_load = os.getloadavg()
            rows = tuple(dict.fromkeys(("cpu-fp32", *args.rows.split(","))))
            prepared = prepare(name, Path(tmp), threads, rows, args.calib_samples, bool(args.reuse))
            rounds = args.rounds if name == "sudoku" else max(args.rounds, 15)
            model = {
                "build_s": {k: round(v, 2) for k, v in prepared["timings"].items()},
                "static_calib_samples": args.calib_samples,
                "static_build_stages_s": prepared["static_stage_s"],
                "static_recipe": prepared["static_recipe"],
                **measure(name, prepared, (1, 8), rounds, threads),
                "rounds": rounds,
            }
            if prepared.get("reused"):
                model["note"] = (
                    "timed from the artifacts of an interrupted run of this script (its builds: the "
                    "build times, from their manifests); rows it had not built are missing"
                )
            if name != "bundled":
                model["static_accuracy_check_estimate_s"] = check_estimate(model)
            model["load_average_at_start_and_end"] = [start_load, os.getloadavg()]
            report["models"][name] = model
            out.write_text(json.dumps(report, indent=2) + "\n")
    out.write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))


def markdown(report: dict) -> str:
    lines = [
        "| model | row | build s | b1 ms | b1 vs fp32 | b8 ms | b8 vs fp32 | exact % | agree % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, m in report["models"].items():
        acc = m.get("accuracy", {})
        for row in (r for r in ROWS if r in m["latency_ms_per_call"]["1"]):
            cells = [name, row, f"{m['build_s'].get(f'{row}_build_s', 0):.1f}"]
            for b in ("1", "8"):
                cells += [
                    f"{m['latency_ms_per_call'][b][row]['median']:.1f}",
                    f"{m['speedup_vs_cpu_fp32'][b][row]:.2f}x",
                ]
            cells += [
                str(acc.get("exact_accuracy_pct", {}).get(row, "-")),
                str(acc.get("argmax_agreement_with_fp32_pct", {}).get(row, "-")),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    env = report["machine"]
    lines.append(
        f"\n{env['cpus']} CPUs ({env['platform']}; {' '.join(env.get('isa', []))}), ONNX Runtime "
        f"{env['onnxruntime']}, torch {env['torch']}. Shared machine (load averages per model in the "
        "JSON): compare the ratios, measured within one run per model."
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
