"""Per-ACT-step evaluation of a trained model: the exact-accuracy curve over steps and
what the learned Q-head would save if rows stopped where it says "halt".

Runs the PyTorch reference (eval mode: every row runs all ``halt_max_steps`` segments)
and records, per row and step, whether the answer is exactly right and ``q_halt``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hrm_deploy.data.format import Split, select_examples
from hrm_deploy.metrics import per_step_accuracy, row_scores
from hrm_deploy.model.hrm import HRMACT


@torch.inference_mode()
def step_outcomes(model: HRMACT, split: Split, samples: int | None = None, batch: int = 256) -> dict[str, np.ndarray]:
    """Per row and ACT step: ``solved`` [N, K] bool, ``token_fraction`` [N, K] (both
    :func:`hrm_deploy.metrics.row_scores`), ``q_halt`` and ``q_continue`` [N, K] logits
    (K = halt_max_steps), on ``samples`` test rows (all if None)."""
    from hrm_deploy.train.sampler import to_batch

    was_training = model.training
    model.eval()
    idx = select_examples(split, samples, seed=0) if samples else np.arange(len(split))
    device = next(model.parameters()).device
    steps = model.config.halt_max_steps
    parts: dict[str, list[np.ndarray]] = {"solved": [], "token_fraction": [], "q_halt": [], "q_continue": []}
    for start in range(0, len(idx), batch):
        b = to_batch(split, idx[start : start + batch], split.metadata.ignore_label_id, device=device)
        carry = model.initial_carry(b)
        rows: dict[str, list[torch.Tensor]] = {k: [] for k in parts}
        for _ in range(steps):
            carry, out = model(carry, b)
            solved, token_fraction = row_scores(out["logits"].argmax(-1), b["labels"])
            rows["solved"].append(solved)
            rows["token_fraction"].append(token_fraction)
            rows["q_halt"].append(out["q_halt_logits"].float())
            rows["q_continue"].append(out["q_continue_logits"].float())
        for k, stacked in parts.items():
            stacked.append(torch.stack(rows[k], dim=1).cpu().numpy())
    model.train(was_training)
    return {k: np.concatenate(v) for k, v in parts.items()}


def _halting(solved: np.ndarray, stop: np.ndarray) -> dict[str, float]:
    """Rows stop at the first step where ``stop`` holds (else the last step)."""
    k = solved.shape[1]
    first = np.where(stop.any(1), stop.argmax(1), k - 1)
    return {
        "mean_steps": float((first + 1).mean()),
        "p90_steps": float(np.percentile(first + 1, 90)),
        "exact_accuracy": float(solved[np.arange(len(solved)), first].mean()),
    }


def act_report(outcomes: dict[str, np.ndarray]) -> dict[str, Any]:
    """Summary of :func:`step_outcomes`: per-step exact/token accuracy (rounded to 4 digits),
    ``exact_accuracy`` after all steps, the Q-head's calibration (does ``q_halt >= 0`` predict
    a solved row), and halting at ``sigmoid(q_halt) > 0.5`` and at ``q_halt > q_continue``
    versus running all steps (names as :mod:`hrm_deploy.metrics`)."""
    solved, q_halt, q_cont = outcomes["solved"], outcomes["q_halt"], outcomes["q_continue"]
    k = solved.shape[1]
    curves = per_step_accuracy(solved, outcomes["token_fraction"])
    return {
        "count": len(solved),
        "halt_max_steps": k,
        **{name: [round(x, 4) for x in curve] for name, curve in curves.items()},
        "per_step_mean_sigmoid_q_halt": [round(float(x), 4) for x in (1 / (1 + np.exp(-q_halt))).mean(0)],
        "q_halt_sign_accuracy": round(float(((q_halt >= 0) == solved).mean()), 4),
        "exact_accuracy": float(solved[:, -1].mean()),
        "halt_sigmoid_0.5": _halting(solved, q_halt > 0),
        "halt_q_halt_gt_q_continue": _halting(solved, q_halt > q_cont),
    }
