"""Halting in verify, bench and solve: every rule evaluated on a runner's outputs, the report, its
markdown and the accuracy-vs-steps plot; ``--halt`` texts prepared, a ``budget:P`` threshold
calibrated by running the artifact (:func:`calibrate_budget`). It opens runners, so it sits beside
verify, above the backends; :mod:`hrm_deploy.halting` holds the rules and the scheduler."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.contract import HaltFn
from hrm_deploy.errors import ConfigError, MachineError
from hrm_deploy.halting.budget import accuracy_vs_steps, calibrate_threshold, exact_at, rule_summary
from hrm_deploy.halting.rules import HaltMode, HaltRule, resolve_rule, simulate_steps
from hrm_deploy.halting.store import budget_key, calibration_cache, seal_budget, stored_budgets
from hrm_deploy.metrics import solved_rows

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------- verify / bench
def _run_all(runner: Any, examples: Any, batch: int, halt: HaltFn | None) -> dict[str, np.ndarray]:
    kwargs = {"halt": halt} if halt is not None else {}
    parts = [runner.infer(examples.feeds(s, s + batch), **kwargs) for s in range(0, len(examples), batch)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def evaluate_halting(
    runner: Any,
    examples: Any,
    rules: list[HaltRule],
    batch: int = 64,
    full: dict[str, np.ndarray] | None = None,
    min_steps: int = 1,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """Per rule: exact accuracy, mean/p90 steps and puzzles/s of an early-exit run on an
    activated runner (rules it cannot run early, e.g. on an unrolled graph, are simulated from
    the per-step outputs and marked so), plus the accuracy-vs-mean-steps curve of ``threshold:X``.
    ``full``: the runner's all-step outputs when already computed."""
    import time

    labels = examples.labels
    if labels is None:
        raise ConfigError("halting accuracy needs labelled examples (a dataset folder or a .npz with labels)")
    full = full if full is not None else _run_all(runner, examples, batch, None)
    q_halt = full["q_halt_logits"]
    q_cont = full.get("q_continue_logits")
    per_step = full.get("step_predictions")
    steps = max(int(q_halt.shape[1]), int(getattr(runner, "steps", 0) or 0))
    # the steps each row ran without a rule: all of them, except in a loop graph, which halts by the rule
    # fixed at its export (its table row says so, and its mean is what bench's table shows)
    used = np.asarray(full.get("steps_used", np.full(len(examples), steps)), np.int32)
    built_in = bool((used < steps).any()) or getattr(runner, "mode", None) == "loop"
    report: dict[str, Any] = {
        "steps": steps,
        "examples": len(examples),
        "all_steps": rule_summary(used, solved_rows(full["logits"], labels), steps),
        "baseline": "its own rule (a loop graph)" if built_in else "off (all steps)",
        "rules": {},
    }
    for rule in rules:
        entry: dict[str, Any]
        simulated = None
        if per_step is not None and (q_cont is not None or rule.mode is not HaltMode.Q):
            simulated = simulate_steps(rule, q_halt, q_cont if q_cont is not None else np.zeros_like(q_halt))
        try:
            start = time.perf_counter()
            out = _run_all(runner, examples, batch, rule.should_halt)
            seconds = time.perf_counter() - start
            entry = {
                **rule_summary(out["steps_used"], solved_rows(out["logits"], labels), steps),
                "run": "early exit",
                "puzzles_per_s": len(examples) / seconds,
            }
            if simulated is not None:
                entry["agrees_with_simulation"] = float((simulated == out["steps_used"]).mean())
        except ConfigError:
            if built_in:
                entry = {"run": "not available: a loop graph halts by the rule fixed at its export"}
            elif simulated is None or per_step is None:
                entry = {"run": "not available: this artifact exposes no per-step outputs"}
            else:
                entry = {
                    **rule_summary(simulated, exact_at(per_step, simulated, labels), steps),
                    "run": "simulated from every step's outputs (this artifact always computes all steps)",
                }
        if rule.mode is HaltMode.BUDGET:
            entry["threshold"] = rule.threshold
        report["rules"][rule.text] = entry
    if per_step is not None:
        report["curve"] = accuracy_vs_steps(
            q_halt, q_cont if q_cont is not None else np.zeros_like(q_halt), per_step, labels, min_steps, max_steps
        )
    return report


def halting_markdown(report: dict[str, Any]) -> str:
    lines = ["| halting rule | exact accuracy | mean steps | p90 steps | run |", "|---|---|---|---|---|"]
    baseline = report.get("baseline", "off (all steps)")
    rows = [(baseline, {**report["all_steps"], "run": baseline.split(" (")[0]})] + list(report["rules"].items())
    for name, entry in rows:
        if "mean_steps" not in entry:
            lines.append(f"| {name} | - | - | - | {entry['run']} |")
            continue
        speed = f", {entry['puzzles_per_s']:.1f} puzzles/s" if "puzzles_per_s" in entry else ""
        lines.append(
            f"| {name} | {entry.get('exact_accuracy', float('nan')):.2%} | {entry['mean_steps']:.2f} | "
            f"{entry['p90_steps']:.0f} of {report['steps']} | {entry['run']}{speed} |"
        )
    return "\n".join(lines) + "\n"


def plot_curve(report: dict[str, Any], path: Any, title: str = "") -> Any:
    """accuracy-vs-mean-steps PNG (None without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    curve = report.get("curve") or []
    if curve:
        ax.plot(
            [c["mean_steps"] for c in curve],
            [100 * c["exact_accuracy"] for c in curve],
            marker=".",
            label="threshold:X sweep",
        )
    baseline = report.get("baseline", "all steps").split(" (")[0]
    for name, entry in [(baseline, report["all_steps"]), *report["rules"].items()]:
        if "mean_steps" in entry and "exact_accuracy" in entry:
            ax.scatter([entry["mean_steps"]], [100 * entry["exact_accuracy"]], zorder=3)
            ax.annotate(name, (entry["mean_steps"], 100 * entry["exact_accuracy"]), fontsize=8)
    ax.set_xlabel("mean ACT steps")
    ax.set_ylabel("exact accuracy (%)")
    ax.set_title(title or "accuracy vs mean ACT steps")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def prepare_rules(
    texts: list[str],
    artifact: str,
    data: str | None,
    *,
    min_steps: int = 1,
    max_steps: int | None = None,
    calib_data: str | None = None,
    flag: str = "--data",
    **runner_options: Any,
) -> list[HaltRule]:
    """Parse ``--halt`` texts; ``budget:P`` takes the threshold stored in the artifact's manifest,
    else calibrates it now, on fresh puzzles of the checkpoint's dataset spec when it stores one
    (never trained on), else on ``data``'s train split (held out from the test split verify and
    bench report on). ``calib_data``, when given, is used instead of both."""

    from hrm_deploy.provenance import heldout_data

    rules = []
    for text in texts:
        rule = resolve_rule(HaltRule.parse(text, min_steps=min_steps, max_steps=max_steps), artifact)
        if rule.mode is HaltMode.BUDGET and rule.threshold is None:
            fresh = heldout_data(artifact) if calib_data is None else None
            source = calib_data or (str(fresh.path) if fresh is not None else data)
            if source is None:
                raise ConfigError(
                    f"--halt {rule.text} needs calibration data and {Path(artifact).name} records no "
                    f"dataset spec: pass {flag} DATASET_DIR"
                )
            log.info(f"calibrating --halt {rule.text} on " + (fresh.message if fresh else f"{source}'s train split"))
            entry = calibrate_budget(
                artifact, source, float(rule.budget or 0.0), min_steps=min_steps, max_steps=max_steps, **runner_options
            )
            rule = rule.with_threshold(entry["threshold"])
        rules.append(rule)
    return rules


def calibrate_budget(
    artifact: str,
    data: str,
    budget_points: float,
    *,
    samples: int | None = 512,
    split: str = "train",
    min_steps: int = 1,
    max_steps: int | None = None,
    batch: int = 64,
    **runner_options: Any,
) -> dict[str, Any]:
    """Calibrate ``budget:P`` for ``artifact`` on held-out examples of ``data`` (default: the
    dataset's train split, so verify's test split stays unseen) and store the threshold in the
    artifact's manifest under ``halting.budgets``. Returns the stored entry."""
    from hrm_deploy.backends import open_runner
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.manifest import check_artifact
    from hrm_deploy.runtime.infer import infer_all

    judged = (check_artifact(artifact) or {}).get("sha256") if Path(artifact).is_file() else None
    examples = load_examples(data, samples, split=split if (_has_split(data, split)) else "test")
    if examples.labels is None:
        raise ConfigError(f"budget calibration needs labelled examples; {data} has none")
    runner = open_runner(artifact, **runner_options)
    runner.activate()
    try:
        out = infer_all(runner, examples, batch)
    finally:
        runner.close()
    if "q_continue_logits" not in out or "step_predictions" not in out:
        raise ConfigError(
            f"{artifact} does not expose per-step outputs; budget calibration needs a step graph, "
            "an unrolled graph exported with --step-predictions, an engine or a checkpoint"
        )
    rule = HaltRule(HaltMode.BUDGET, None, budget_points, min_steps, max_steps)
    entry = {
        **calibrate_threshold(
            out["q_halt_logits"],
            out["q_continue_logits"],
            out["step_predictions"],
            examples.labels,
            budget_points,
            min_steps,
            max_steps,
        ),
        "budget_points": budget_points,
        "min_steps": min_steps,
        "max_steps": max_steps,
        "data": examples.source,
        "split": split,
        "examples": len(examples),
    }
    _store_budget(artifact, rule, entry, judged)
    return entry


def _store_budget(artifact: str, rule: HaltRule, entry: dict[str, Any], judged: str | None) -> None:
    """Keep a calibrated threshold: in the artifact's manifest when it is ours and writable (only
    while the manifest still describes the bytes ``judged``), else in the user cache by sha256."""
    from hrm_deploy.io import write_json
    from hrm_deploy.manifest import manifest_path, read_manifest, update_manifest

    path = manifest_path(artifact)
    if path.is_file() and os.access(path, os.W_OK) and os.access(path.parent, os.W_OK):
        # our artifact: the threshold travels with it
        halting = dict(read_manifest(artifact).get("halting", {}))
        halting["budgets"] = {**halting.get("budgets", {}), budget_key(rule): entry}
        update_manifest(artifact, expect_sha256=judged, halting=halting)
        return
    # a checkpoint, the bundled model or a read-only artifact: the user cache, keyed by sha256
    cached = calibration_cache(artifact)
    budgets = {**stored_budgets(artifact), budget_key(rule): seal_budget(entry, artifact)}
    try:
        write_json(cached, {"artifact": str(artifact), "budgets": budgets})
    except (OSError, MachineError) as exc:
        raise ConfigError(
            f"cannot store the calibrated threshold in {cached} ({getattr(exc, 'strerror', None) or exc}); set "
            "HRM_DEPLOY_CACHE to a writable folder"
        ) from None


def _has_split(data: str, split: str) -> bool:
    from pathlib import Path

    return (Path(data) / split / "dataset.json").is_file()
