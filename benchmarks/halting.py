"""Early halting on a trained multi-step model (CPU, ONNX Runtime step graph).

Writes ``benchmarks/results/halting_<model>.json`` (+ ``.png``): on fresh held-out puzzles of the
checkpoint's own dataset spec (a seed its training data did not use),
* the per-ACT-step exact accuracy and the accuracy-vs-mean-steps curve of ``threshold:X``;
* per rule (``q``, ``budget:P`` calibrated on a separate fresh calibration set): exact accuracy,
  mean/p90 steps, accuracy lost vs all steps;
* throughput (puzzles/s, same puzzles, same rule, one process, ratios from one run) of
  all steps; fixed batches with halting where halted rows stay in the batch, masked (what a
  device loop does); fixed batches that drop halted rows (the CPU driver's default); and
  continuous batching (a halted row's slot takes the next puzzle via the step graph's reset).

    python benchmarks/halting.py [--checkpoint CKPT] [--eval 512] [--calib 512] [--batch 64]

Default checkpoint: the bundled ``sudoku-small`` preset when present, else ``sudoku-tiny``
(one ACT step: halting cannot save anything there).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PRESETS = ROOT / "hrm_deploy" / "train" / "presets"


def _fresh_data(
    checkpoint: Path,
    work: Path,
    calib: int,
    evaluate: int,
    seed_offset: int,
    preset_name: str | None,
    spec_json: str | None = None,
) -> Path:
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.model.checkpoint import read_checkpoint

    spec = dict(read_checkpoint(checkpoint).extra.get("dataset") or {})
    if not spec and preset_name:  # a training run's step_N.pt: the preset's spec
        from hrm_deploy.train.presets import preset

        spec = {"generator": "sudoku", **preset(preset_name)["data"]}
    if not spec and spec_json:  # or given outright, e.g. '{"blanks": [10, 30]}'
        spec = {"generator": "sudoku", **json.loads(spec_json)}
    if spec.pop("generator", None) != "sudoku":
        raise SystemExit(f"{checkpoint} records no Sudoku dataset spec; pass --preset NAME")
    spec = {k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()}
    spec.update(train=calib, test=evaluate, augment=0, seed=int(spec.get("seed", 0)) + seed_offset)
    known = {f.name for f in dataclasses.fields(SudokuSpec)}
    folder = work / "heldout"
    generate_sudoku(SudokuSpec(**{k: v for k, v in spec.items() if k in known}), str(folder))
    return folder


def _timed(fn, repeats: int) -> tuple[float, dict]:
    fn()  # warm-up
    best, out = float("inf"), {}
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    small = PRESETS / "sudoku-small.pt"
    parser.add_argument("--checkpoint", default=str(small if small.is_file() else PRESETS / "sudoku-tiny.pt"))
    parser.add_argument("--eval", type=int, default=512, help="held-out puzzles for accuracy and throughput")
    parser.add_argument("--calib", type=int, default=512, help="separate held-out puzzles for budget calibration")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--budgets", default="0.5,1,2")
    parser.add_argument("--throughput-rules", default="budget:1,q", help="rules timed four ways")
    parser.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0: ORT's default)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--preset", default=None, help="dataset spec of this preset when the checkpoint has none")
    parser.add_argument("--spec", default=None, help="JSON SudokuSpec fields when the checkpoint has no spec")
    parser.add_argument("--note", default=None, help="free text recorded in the result (e.g. where the file came from)")
    parser.add_argument("--out", default=None, help="result JSON (default benchmarks/results/halting_<model>.json)")
    args = parser.parse_args()

    from hrm_deploy.backends.ort.runner import OrtRunner
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.halting import (
        HaltMode,
        HaltRule,
        accuracy_vs_steps,
        calibrate_threshold,
        drive,
        exact_at,
        rule_summary,
        run_continuous,
        simulate_steps,
    )

    checkpoint = Path(args.checkpoint)
    name = checkpoint.stem
    out_path = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"halting_{name}.json"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = _fresh_data(
            checkpoint, work, args.calib, args.eval, seed_offset=7919, preset_name=args.preset, spec_json=args.spec
        )
        onnx = export_onnx(
            checkpoint, work / f"{name}.step.onnx", ExportConfig(mode="step", parity=False), quiet=True
        ).path
        runner = OrtRunner(onnx, threads=args.threads or None)
        runner.activate()
        step_fn = runner.step_function()
        steps = step_fn.steps
        evaluation = load_examples(data, None, split="test")
        calibration = load_examples(data, None, split="train")
        labels = evaluation.labels
        assert labels is not None and calibration.labels is not None

        def all_outputs(examples) -> dict:
            parts = [runner.infer(examples.feeds(s, s + args.batch)) for s in range(0, len(examples), args.batch)]
            return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

        full = all_outputs(evaluation)
        full_calib = all_outputs(calibration)
        q_halt, q_cont, preds = full["q_halt_logits"], full["q_continue_logits"], full["step_predictions"]
        all_steps = np.full(len(evaluation), steps, np.int32)
        full_acc = float(exact_at(preds, all_steps, labels).mean())
        result: dict = {
            "checkpoint": str(checkpoint.relative_to(ROOT) if checkpoint.is_relative_to(ROOT) else checkpoint),
            "note": args.note,
            "steps": steps,
            "eval_puzzles": len(evaluation),
            "calib_puzzles": len(calibration),
            "data": "fresh held-out puzzles of the checkpoint's dataset spec (seed + 7919): calibration = train "
            "split, evaluation = test split",
            "machine": {
                "platform": platform.platform(),
                "cpus": __import__("os").cpu_count(),
                "runner": "ort cpu",
                "threads": args.threads or "default",
            },
            "per_step_exact_accuracy": [
                float(exact_at(preds, np.full(len(labels), s, np.int32), labels).mean()) for s in range(1, steps + 1)
            ],
            "all_steps": {"exact_accuracy": full_acc, "mean_steps": float(steps)},
            "curve": accuracy_vs_steps(q_halt, q_cont, preds, labels),
            "rules": {},
        }
        rules = {"q": HaltRule.parse("q")}
        for budget in (float(b) for b in args.budgets.split(",")):
            found = calibrate_threshold(
                full_calib["q_halt_logits"],
                full_calib["q_continue_logits"],
                full_calib["step_predictions"],
                calibration.labels,
                budget,
            )
            rules[f"budget:{budget:g}"] = HaltRule(HaltMode.BUDGET, found["threshold"], budget)
            result.setdefault("calibration", {})[f"budget:{budget:g}"] = found
        for text, rule in rules.items():
            used = simulate_steps(rule, q_halt, q_cont)
            summary = rule_summary(used, exact_at(preds, used, labels), steps)
            summary["loss_points"] = 100 * (full_acc - summary["exact_accuracy"])
            if rule.threshold is not None:
                summary["threshold"] = rule.threshold
            result["rules"][text] = summary

        # throughput: the same puzzles under each rule, four ways (answers must agree)
        inputs, pids, batch = evaluation.inputs, evaluation.puzzle_identifiers, args.batch

        def fixed(halt, compact):
            parts = [
                drive(step_fn, inputs[s : s + batch], pids[s : s + batch], halt, compact=compact)
                for s in range(0, len(inputs), batch)
            ]
            return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

        def measure(fn) -> tuple[dict, np.ndarray]:
            seconds, out = _timed(fn, args.repeats)
            solved = exact_at(out["step_predictions"], out["steps_used"], labels)
            return (
                {
                    "seconds": seconds,
                    "puzzles_per_s": len(inputs) / seconds,
                    **rule_summary(out["steps_used"], solved, steps),
                },
                out["logits"].argmax(-1),
            )

        all_stats, _ = measure(lambda: fixed(None, True))
        result["throughput"] = {
            "batch": batch,
            "repeats": args.repeats,
            "timing": "best of repeats after a warm-up",
            "all_steps": all_stats,
            "rules": {},
        }
        for text in args.throughput_rules.split(","):
            if text not in rules:
                continue
            rule = rules[text]
            modes = {
                "fixed_batch_masked": lambda r=rule: fixed(r.should_halt, False),
                "fixed_batch_drop_halted": lambda r=rule: fixed(r.should_halt, True),
                "continuous_batching": lambda r=rule: run_continuous(step_fn, inputs, pids, batch, r),
            }
            throughput, answers = {}, {}
            for mode, fn in modes.items():
                throughput[mode], answers[mode] = measure(fn)
            same = all((a == answers["fixed_batch_drop_halted"]).all() for a in answers.values())
            base = throughput["fixed_batch_masked"]["puzzles_per_s"]
            for stats in throughput.values():
                stats["ratio_vs_fixed_batch_masked"] = stats["puzzles_per_s"] / base
                stats["ratio_vs_all_steps"] = stats["puzzles_per_s"] / all_stats["puzzles_per_s"]
            result["throughput"]["rules"][text] = {"same_answers_in_every_mode": bool(same), "modes": throughput}
        runner.close()

    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    try:
        from hrm_deploy.halting_report import plot_curve

        plot_curve(
            {"curve": result["curve"], "all_steps": result["all_steps"], "rules": result["rules"]},
            out_path.with_suffix(".png"),
            f"{name}: early halting ({len(evaluation)} held-out puzzles)",
        )
    except ImportError:
        pass
    speeds = {
        text: {m: round(v["puzzles_per_s"], 1) for m, v in entry["modes"].items()}
        for text, entry in result["throughput"]["rules"].items()
    }
    print(
        json.dumps(
            {
                "per_step": result["per_step_exact_accuracy"],
                "rules": result["rules"],
                "all_steps_puzzles_per_s": round(result["throughput"]["all_steps"]["puzzles_per_s"], 1),
                "throughput": speeds,
            },
            indent=1,
        )
    )
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
