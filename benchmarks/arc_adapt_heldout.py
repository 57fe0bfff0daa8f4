"""pass@2 on ARC-format tasks a model never saw, before and after ``hrm-deploy adapt``.

Synthetic tasks small enough for a CPU: each task applies one rule (flip left-right, flip up-down,
rotate 180 degrees or transpose) to random 3x3..5x5 grids of colours 0..9; its rule is not written
anywhere, so the model must learn it into the task's puzzle-embedding row from the demonstrations.
With ``--family colour`` a task instead replaces one colour by another (both drawn from 1..9) in
3x3 grids. A base ``arc-tiny`` model is trained on ``--train-tasks`` tasks (``data arc``, canvas 6x6
or 4x4); other
tasks, held out of its training entirely, are then adapted (``--train embeddings``: only their new
rows learn). "Before" is the same held-out dataset with the new rows as ``adapt`` initialises them
(zeros: ``--puzzle-emb-lr 0``); "after" is the adapted table. Every stage is the command line,
recorded with its wall time in the results file; the held-out score is also checked through an
external-table ONNX export of the base fed the adapted table (no rebuild).

    python benchmarks/arc_adapt_heldout.py --work /tmp/adapt-bench
Writes benchmarks/results/arc_adapt_heldout.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RULES = {"fliplr": np.fliplr, "flipud": np.flipud, "rot180": lambda g: np.rot90(g, 2), "transpose": np.transpose}


def _rule(family: str, i: int, rng: np.random.Generator):
    """Task i's rule and its grid sides: a geometric one (i mod 4) on 3..5 squares, or replacing one
    colour by another (both drawn from 1..9) on 3x3 grids that hold the replaced colour."""
    if family == "geometry":
        return RULES[list(RULES)[i % len(RULES)]], (3, 6), None
    old, new = (int(c) for c in rng.choice(np.arange(1, 10), size=2, replace=False))
    return (lambda g: np.where(g == old, new, g)), (3, 4), old


def _pair(rule, sides: tuple[int, int], must: int | None, rng: np.random.Generator) -> dict:
    side = int(rng.integers(*sides))
    grid = rng.integers(0, 10, size=(side, side))
    if must is not None:  # the replaced colour appears, so the answer shows the rule
        grid[int(rng.integers(side)), int(rng.integers(side))] = must
    return {"input": grid.tolist(), "output": np.ascontiguousarray(rule(grid)).tolist()}


def write_tasks(folder: Path, prefix: str, count: int, rng: np.random.Generator, family: str, demos: int = 3) -> None:
    """``count`` tasks named ``{prefix}{i:04d}`` of ``family``, ``demos`` train pairs and one test pair."""
    folder.mkdir(parents=True)
    for i in range(count):
        rule, sides, must = _rule(family, i, rng)
        pairs = [_pair(rule, sides, must, rng) for _ in range(demos + 1)]
        task = {"train": pairs[:demos], "test": pairs[demos:]}
        (folder / f"{prefix}{i:04d}.json").write_text(json.dumps(task))


def run(log: list[dict], *args: str) -> str:
    """Run ``hrm-deploy ARGS``, record the command and its wall time; return its stdout."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hrm_deploy", *args], capture_output=True, text=True, check=False)
    seconds = round(time.perf_counter() - started, 1)
    log.append({"command": "hrm-deploy " + " ".join(args), "seconds": seconds, "exit": done.returncode})
    print(f"[{seconds:7.1f} s] hrm-deploy {' '.join(args)}", flush=True)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def pass_at(report: Path) -> dict[str, float]:
    return json.loads(report.read_text())["pass_at"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="Scratch folder (created; must not exist).")
    parser.add_argument("--train-tasks", type=int, default=64)
    parser.add_argument("--heldout-tasks", type=int, default=16)
    parser.add_argument("--num-aug", type=int, default=4)
    parser.add_argument("--train-steps", type=int, default=1500)
    parser.add_argument("--adapt-steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--curve", default="10,30,100", help="Also adapt with these step budgets (comma-separated).")
    parser.add_argument("--family", choices=("colour", "geometry"), default="colour", help="The tasks' rules.")
    parser.add_argument("--out", type=Path, help="Default: benchmarks/results/arc_adapt_heldout_<family>.json.")
    args = parser.parse_args()
    args.out = args.out or Path(__file__).parent / "results" / f"arc_adapt_heldout_{args.family}.json"
    canvas = "6" if args.family == "geometry" else "4"
    work = args.work
    rng = np.random.default_rng(0)
    write_tasks(work / "tasks" / "training", "tr", args.train_tasks, rng, args.family)
    write_tasks(work / "tasks" / "evaluation", "ev", 4, rng, args.family)
    write_tasks(work / "heldout", "ho", args.heldout_tasks, rng, args.family)
    log: list[dict] = []
    w, aug, threads = str(work), str(args.num_aug), str(args.threads)
    run(
        log,
        "data",
        "arc",
        "--source",
        f"{w}/tasks",
        "--max-grid",
        canvas,
        "--num-aug",
        aug,
        "-o",
        f"{w}/base-data",
        "-q",
    )
    train = ["train", "--preset", "arc-tiny", "--data", f"{w}/base-data", "-o", f"{w}/base"]
    run(log, *train, "--steps", str(args.train_steps), "--batch-size", "16", "--threads", threads, "--device", "cpu")
    base = f"{w}/base/last.pt"
    adapt = ["adapt", base, "--tasks", f"{w}/heldout", "--num-aug", aug, "--device", "cpu", "--threads", threads, "-q"]
    run(log, *adapt, "-o", f"{w}/before", "--steps", "1", "--puzzle-emb-lr", "0")
    run(log, *adapt, "-o", f"{w}/after", "--steps", str(args.adapt_steps))

    def scored(name: str) -> dict[str, float]:
        """pass@1 and pass@2 of adapt run ``name`` on its own held-out dataset."""
        run(
            log,
            "arc-eval",
            f"{w}/{name}/last.pt",
            "--data",
            f"{w}/{name}/data",
            "-o",
            f"{w}/{name}.json",
            "--k",
            "1,2",
            "-q",
        )
        return pass_at(work / f"{name}.report.json")

    score = {name: scored(name) for name in ("before", "after")}
    curve = {}
    for steps in [int(n) for n in args.curve.split(",") if n.strip()]:
        run(log, *adapt, "-o", f"{w}/after-{steps}", "--steps", str(steps))
        curve[steps] = {**scored(f"after-{steps}"), "seconds": log[-2]["seconds"]}
    curve[args.adapt_steps] = {**score["after"], "seconds": log[3]["seconds"]}
    run(log, "arc-eval", base, "--data", f"{w}/base-data", "-o", f"{w}/base-eval.json", "--k", "1,2", "-q")
    run(log, "export", base, "--puzzle-emb", "external", "-o", f"{w}/base.onnx", "-q")
    run(
        log,
        "arc-eval",
        f"{w}/base.onnx",
        "--data",
        f"{w}/after/data",
        "--puzzle-table",
        f"{w}/after",
        "-o",
        f"{w}/onnx.json",
        "--k",
        "1,2",
        "-q",
    )
    same = (work / "onnx.json").read_text() == (work / "after.json").read_text()
    result = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": args.threads,
            "cores": os.cpu_count(),
        },
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "heldout_pass_at": score,
        "heldout_pass_at_by_adapt_steps": {str(k): curve[k] for k in sorted(curve)},
        "base_own_evaluation_pass_at": pass_at(work / "base-eval.report.json"),
        "onnx_external_table_same_submission_as_adapted_checkpoint": same,
        "onnx_pass_at": pass_at(work / "onnx.report.json"),
        "adapt_record": json.loads((work / "after" / "adapt.json").read_text()),
        "commands": log,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"heldout_pass_at": score, "onnx_same": same}, indent=2))
    shutil.rmtree(work / "tasks", ignore_errors=True)


if __name__ == "__main__":
    main()
