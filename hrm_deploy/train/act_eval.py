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
from hrm_deploy.model.hrm import HRMACT
from hrm_deploy.train.losses import IGNORE_LABEL_ID


@torch.inference_mode()
def step_outcomes(model: HRMACT, split: Split, samples: int | None = None, batch: int = 256) -> dict[str, np.ndarray]:
    """Per row and ACT step: ``solved`` [N, K] bool, ``token_acc`` [N, K], ``q_halt`` and
    ``q_continue`` [N, K] logits (K = halt_max_steps), on ``samples`` test rows (all if None)."""
    from hrm_deploy.train.loop import to_batch

    was_training = model.training
    model.eval()
    idx = select_examples(split, samples, seed=0) if samples else np.arange(len(split))
    device = next(model.parameters()).device
    steps = model.config.halt_max_steps
    parts: dict[str, list[np.ndarray]] = {"solved": [], "token_acc": [], "q_halt": [], "q_continue": []}
    for start in range(0, len(idx), batch):
        b = to_batch(split, idx[start : start + batch], split.metadata.ignore_label_id, device=device)
        mask = b["labels"] != IGNORE_LABEL_ID
        counts = mask.sum(-1)
        carry = model.initial_carry(b)
        rows: dict[str, list[torch.Tensor]] = {k: [] for k in parts}
        for _ in range(steps):
            carry, out = model(carry, b)
            correct = (out["logits"].argmax(-1) == b["labels"]) & mask
            rows["solved"].append(correct.sum(-1) == counts)
            rows["token_acc"].append(correct.sum(-1) / counts.clamp_min(1))
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
    """Summary of :func:`step_outcomes`: per-step exact/token accuracy, the Q-head's calibration
    (does ``q_halt >= 0`` predict a solved row), and halting at ``sigmoid(q_halt) > 0.5``
    and at ``q_halt > q_continue`` versus running all steps."""
    solved, q_halt, q_cont = outcomes["solved"], outcomes["q_halt"], outcomes["q_continue"]
    k = solved.shape[1]
    return {
        "count": len(solved),
        "halt_max_steps": k,
        "per_step_exact": [round(float(x), 4) for x in solved.mean(0)],
        "per_step_token": [round(float(x), 4) for x in outcomes["token_acc"].mean(0)],
        "per_step_mean_sigmoid_q_halt": [round(float(x), 4) for x in (1 / (1 + np.exp(-q_halt))).mean(0)],
        "q_halt_sign_accuracy": round(float(((q_halt >= 0) == solved).mean()), 4),
        "final_exact": float(solved[:, -1].mean()),
        "halt_sigmoid_0.5": _halting(solved, q_halt > 0),
        "halt_q_halt_gt_q_continue": _halting(solved, q_halt > q_cont),
    }
