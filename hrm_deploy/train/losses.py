"""Upstream's ACT loss head: LM loss (stablemax or softmax CE) + Q-halt/Q-continue BCE, and metrics."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hrm_deploy.metrics import IGNORE_LABEL_ID, row_scores


def log_stablemax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    s = torch.where(x < 0, 1 / (1 - x + 1e-30), x + 1)
    return torch.log(s / s.sum(dim=dim, keepdim=True))


def stablemax_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token loss, computed in float64 as upstream."""
    logprobs = log_stablemax(logits.to(torch.float64))
    valid = labels != IGNORE_LABEL_ID
    picked = torch.gather(logprobs, -1, torch.where(valid, labels, 0).long().unsqueeze(-1)).squeeze(-1)
    return -torch.where(valid, picked, 0)


def softmax_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(
        logits.float().flatten(0, -2), labels.long().flatten(), ignore_index=IGNORE_LABEL_ID, reduction="none"
    ).view(labels.shape)


LOSSES = {"stablemax_cross_entropy": stablemax_cross_entropy, "softmax_cross_entropy": softmax_cross_entropy}


def act_loss(outputs: dict, labels: torch.Tensor, halted: torch.Tensor, steps: torch.Tensor, loss_type: str):
    """Returns (total loss summed over the batch, metric sums dict) as upstream's ACTLossHead.

    The metrics are sums over the rows that halted this step (divide by ``count``), under
    :mod:`hrm_deploy.metrics`' names; ``token_accuracy`` is upstream's ``accuracy``."""
    counts = (labels != IGNORE_LABEL_ID).sum(-1)
    divisor = counts.clamp_min(1).unsqueeze(-1)
    logits = outputs["logits"]
    with torch.no_grad():
        seq_correct, token_fraction = row_scores(logits.argmax(-1), labels)
        valid = halted & (counts > 0)
        metrics = {
            "count": valid.sum(),
            "token_accuracy": torch.where(valid, token_fraction, 0).sum(),
            "exact_accuracy": (valid & seq_correct).sum(),
            "q_halt_accuracy": (valid & ((outputs["q_halt_logits"] >= 0) == seq_correct)).sum(),
            "steps": torch.where(valid, steps, 0).sum(),
        }
    lm_loss = (LOSSES[loss_type](logits, labels) / divisor).sum()
    q_halt_loss = F.binary_cross_entropy_with_logits(
        outputs["q_halt_logits"], seq_correct.to(outputs["q_halt_logits"].dtype), reduction="sum"
    )
    total = lm_loss + 0.5 * q_halt_loss
    metrics.update(lm_loss=lm_loss.detach(), q_halt_loss=q_halt_loss.detach())
    if "target_q_continue" in outputs:
        q_continue_loss = F.binary_cross_entropy_with_logits(
            outputs["q_continue_logits"], outputs["target_q_continue"], reduction="sum"
        )
        total = total + 0.5 * q_continue_loss
        metrics["q_continue_loss"] = q_continue_loss.detach()
    return total, metrics
