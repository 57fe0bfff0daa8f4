"""The cpu target's two INT8 recipes against its FP32 graph, in one run: speed, accuracy and
whether a puzzle's answer depends on the puzzles batched with it.

* ``dynamic`` (default): activations quantized per call with one scale for the whole batch;
* ``blockwise``: activations quantized per row and block (MatMulNBits, accuracy level 4).

Models: the bundled trained ACT model (exact accuracy on 2,000 held-out puzzles of its
difficulty) and the Sudoku-size model (random weights, 16 steps). Batch dependence: the answers
of N puzzles run one at a time vs in one batch of N (bundled: 300; Sudoku size: 16, where
random weights make the recurrence chaotic, so any change shows). Latency: median over rounds of
the paired per-round ratio to FP32 (each round runs every graph once, after a pause), batch 1
and 8, ORT's default threads.

    nice python benchmarks/cpu_int8_recipes.py [--rounds 5]
Writes benchmarks/results/cpu_int8_recipes.json.
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

import numpy as np

ROWS = ("fp32", "dynamic", "blockwise")


def build(name: str, work: Path) -> tuple[dict[str, Path], str, int]:
    from sudoku_size import sudoku_size_model

    from hrm_deploy.backends.ort.builder.cpu import build_cpu
    from hrm_deploy.backends.ort.builder.options import CpuOptions
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.engines.config import EngineConfig
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.train.presets import DEFAULT_PRESET, bundled_checkpoint, preset

    folder = work / name
    folder.mkdir()
    if name == "bundled":
        ckpt = bundled_checkpoint(DEFAULT_PRESET)
        spec = SudokuSpec(train=16, test=2000, blanks=preset(DEFAULT_PRESET)["data"]["blanks"], seed=12345)
        dependence_n = 300
    else:
        ckpt = str(save_checkpoint(folder / "sudoku-random.pt", sudoku_size_model(seed=0)))
        spec = SudokuSpec(train=16, test=16, blanks=(40, 50), seed=0)
        dependence_n = 16
    generate_sudoku(spec, str(folder / "data"))
    fp32 = export_onnx(str(ckpt), folder / "model.onnx", ExportConfig(parity=False), quiet=True).path
    graphs = {}
    for row in ROWS:
        precision, recipe = ("fp32", None) if row == "fp32" else ("int8", row)
        config = EngineConfig(precision, target="cpu", options=CpuOptions(int8_recipe=recipe))
        graphs[row] = build_cpu(fp32, config, folder / f"model.{row}.cpu.ort.onnx", quiet=True).path
    return graphs, str(folder / "data"), dependence_n


def measure(graphs: dict[str, Path], data: str, dependence_n: int, rounds: int, accuracy: bool) -> dict:
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.metrics import accuracy as score
    from hrm_deploy.onnx_runtime import ort_session

    sessions = {row: ort_session(path) for row, path in graphs.items()}
    examples = load_examples(data, None, split="test")

    def answers(session, count: int, batch: int) -> np.ndarray:
        parts = [session.run(["logits"], examples.feeds(i, min(i + batch, count)))[0] for i in range(0, count, batch)]
        return np.concatenate(parts)

    result: dict = {"batch_dependence": {}, "latency_ms": {}, "speedup_vs_fp32": {}}
    for row, session in sessions.items():
        alone, together = answers(session, dependence_n, 1), answers(session, dependence_n, dependence_n)
        differ = (alone.argmax(-1) != together.argmax(-1)).any(-1)
        result["batch_dependence"][row] = {
            "puzzles": dependence_n,
            "answers_differ": int(differ.sum()),
            "max_logit_change": float(np.abs(alone - together).max()),
        }
        print(row, result["batch_dependence"][row], flush=True)
    for batch in (1, 8):
        feeds = examples.feeds(0, batch)
        times: dict[str, list[float]] = {row: [] for row in sessions}
        for session in sessions.values():
            session.run(None, feeds)
        for _ in range(rounds):
            for row, session in sessions.items():
                time.sleep(0.2)
                start = time.perf_counter()
                session.run(None, feeds)
                times[row].append((time.perf_counter() - start) * 1000)
        result["latency_ms"][str(batch)] = {
            row: {"median": round(statistics.median(v), 2), "all": [round(x, 1) for x in v]} for row, v in times.items()
        }
        result["speedup_vs_fp32"][str(batch)] = {
            row: round(statistics.median(a / b for a, b in zip(times["fp32"], v, strict=True)), 3)
            for row, v in times.items()
            if row != "fp32"
        }
        print(batch, result["speedup_vs_fp32"][str(batch)], flush=True)
    if accuracy:
        result["exact_accuracy_pct"] = {
            row: round(100 * score(answers(s, len(examples), 64), examples.labels)["exact_accuracy"], 2)
            for row, s in sessions.items()
        }
        result["accuracy_examples"] = len(examples)
        print(result["exact_accuracy_pct"], flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="bundled,sudoku")
    parser.add_argument("--out", default="benchmarks/results/cpu_int8_recipes.json")
    args = parser.parse_args()
    import onnxruntime as ort

    report: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "onnxruntime": ort.__version__,
            "ort_intra_op_threads": "default (one per core)",
            "load_average_at_start": os.getloadavg(),
        },
        "models": {},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            graphs, data, dependence_n = build(name, Path(tmp))
            rounds = args.rounds if name == "sudoku" else max(args.rounds, 20)
            report["models"][name] = {
                **measure(graphs, data, dependence_n, rounds, name == "bundled"),
                "rounds": rounds,
            }
            out.write_text(json.dumps(report, indent=2) + "\n")
    report["machine"]["load_average_at_end"] = os.getloadavg()
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
