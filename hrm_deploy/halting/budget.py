"""Budget thresholds from outputs: the ``sigmoid(q_halt)`` threshold that loses at most P points of
exact accuracy on per-step outputs, and the accuracy-vs-steps curves it is read from. Running an
artifact to get those outputs (:func:`hrm_deploy.halting_report.calibrate_budget`) sits beside
verify: this room imports no backend."""

from __future__ import annotations

import numpy as np

from hrm_deploy.halting.rules import HaltMode, HaltRule, simulate_steps
from hrm_deploy.metrics import row_scores


def exact_at(step_predictions: np.ndarray, steps_used: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """bool [N]: is each row's answer at its halting step exactly the label (-100 ignored)?"""
    answer = step_predictions[np.arange(len(steps_used)), steps_used - 1]
    return row_scores(answer, labels)[0]


def rule_summary(steps_used: np.ndarray, solved: np.ndarray | None, steps: int) -> dict[str, float]:
    summary = {
        "mean_steps": float(steps_used.mean()),
        "p90_steps": float(np.percentile(steps_used, 90)),
        "max_steps": steps,
    }
    if solved is not None:
        summary["exact_accuracy"] = float(solved.mean())
    return summary


def accuracy_vs_steps(
    q_halt: np.ndarray,
    q_continue: np.ndarray,
    step_predictions: np.ndarray,
    labels: np.ndarray,
    min_steps: int = 1,
    max_steps: int | None = None,
    thresholds: np.ndarray | None = None,
) -> list[dict[str, float]]:
    """The accuracy-vs-mean-steps curve of ``threshold:X`` over a sweep of X (and the ``q``
    rule's point), from one all-steps run: [{threshold, mean_steps, p90_steps, exact_accuracy}]."""
    steps = q_halt.shape[1]
    if thresholds is None:
        thresholds = np.array([0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999])
    curve = []
    for x in thresholds:
        rule = HaltRule(HaltMode.THRESHOLD, float(x), None, min_steps, max_steps)
        used = simulate_steps(rule, q_halt, q_continue)
        curve.append({"threshold": float(x), **rule_summary(used, exact_at(step_predictions, used, labels), steps)})
    return curve


def calibrate_threshold(
    q_halt: np.ndarray,
    q_continue: np.ndarray,
    step_predictions: np.ndarray,
    labels: np.ndarray,
    budget_points: float,
    min_steps: int = 1,
    max_steps: int | None = None,
    max_candidates: int = 400,
) -> dict[str, float]:
    """The ``threshold:X`` with the fewest mean steps whose exact accuracy is at most
    ``budget_points`` below running every step, on these (held-out) examples. Candidates are
    the sigmoid of every observed q_halt (just below each value, so it halts) plus 1.0 (never)."""
    steps = q_halt.shape[1]
    full = exact_at(step_predictions, np.full(len(labels), steps, np.int32), labels).mean()
    finite = q_halt[np.isfinite(q_halt)].astype(np.float64)
    probs = np.unique(1.0 / (1.0 + np.exp(-np.clip(finite, -60, 60))))
    if len(probs) > max_candidates:  # quantiles of the observed values keep the search cheap
        probs = np.unique(np.quantile(probs, np.linspace(0.0, 1.0, max_candidates)))
    # a threshold just below each observed probability halts that row; 1 - 1e-12 never halts
    candidates = np.unique(np.concatenate([np.nextafter(probs, 0.0), [1.0 - 1e-12]]))
    candidates = candidates[(candidates > 0) & (candidates < 1)]
    best: dict[str, float] | None = None
    for x in candidates:
        rule = HaltRule(HaltMode.THRESHOLD, float(x), None, min_steps, max_steps)
        used = simulate_steps(rule, q_halt, q_continue)
        acc = exact_at(step_predictions, used, labels).mean()
        loss = 100.0 * (full - acc)
        if loss <= budget_points + 1e-9 and (best is None or used.mean() < best["mean_steps"]):
            best = {
                "threshold": float(x),
                "mean_steps": float(used.mean()),
                "exact_accuracy": float(acc),
                "full_exact_accuracy": float(full),
                "loss_points": float(loss),
            }
    assert best is not None  # the never-halt candidate loses nothing
    return best
