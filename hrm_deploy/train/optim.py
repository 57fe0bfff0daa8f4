"""Optimizers: pure-PyTorch AdamATan2 (upstream's exact update) and the puzzle-embedding sign-SGD."""

from __future__ import annotations

import torch
from torch.optim import Optimizer


class AdamATan2(Optimizer):
    """Adam with atan2 instead of division, as PyPI ``adam-atan2`` 0.0.3 computes it
    (no epsilon; lr may be 0 at construction since a scheduler sets it every step)::

        p *= 1 - lr * wd
        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        p -= (lr / bc1) * atan2(m, sqrt(v) / sqrt(bc2))
    """

    def __init__(self, params, lr: float = 0.0, betas=(0.9, 0.95), weight_decay: float = 0.0):
        if lr < 0:
            raise ValueError("lr must be >= 0")
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, (beta1, beta2), wd = group["lr"], group["betas"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                step = state["step"].item()
                m, v = state["exp_avg"], state["exp_avg_sq"]
                p.mul_(1 - lr * wd)
                m.lerp_(p.grad, 1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                bc1, bc2 = 1 - beta1**step, 1 - beta2**step
                p.add_(torch.atan2(m, v.sqrt() / bc2**0.5), alpha=-lr / bc1)
        return loss


class PuzzleEmbeddingSignSGD:
    """Upstream's sparse sign-SGD for the puzzle-embedding buffer: only rows looked up
    this step change, ``w <- w (1 - lr wd) - lr sign(sum of grads per row)``. Under
    torch.distributed the ids and grads of all ranks are gathered first, as upstream."""

    def __init__(self, embedding, lr: float = 0.0, weight_decay: float = 0.0):
        self.embedding = embedding
        self.param_groups = [{"lr": lr, "weight_decay": weight_decay}]

    @torch.no_grad()
    def step(self) -> None:
        lookup = self.embedding.last_lookup
        if lookup is None or lookup[1].grad is None:
            return
        ids, grads = lookup[0], lookup[1].grad
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world = torch.distributed.get_world_size()
            all_ids = [torch.empty_like(ids) for _ in range(world)]
            all_grads = [torch.empty_like(grads) for _ in range(world)]
            torch.distributed.all_gather(all_ids, ids)
            torch.distributed.all_gather(all_grads, grads)
            ids, grads = torch.cat(all_ids), torch.cat(all_grads)
        unique, inverse = ids.unique(return_inverse=True)
        summed = torch.zeros(unique.shape[0], grads.shape[1], dtype=grads.dtype, device=grads.device)
        summed.scatter_add_(0, inverse.unsqueeze(-1).expand_as(grads), grads)
        group = self.param_groups[0]
        weights = self.embedding.weights
        rows = weights[unique] * (1 - group["lr"] * group["weight_decay"]) - group["lr"] * summed.sign()
        weights[unique] = rows.to(weights.dtype)
        self.embedding.last_lookup = None

    def zero_grad(self) -> None:
        self.embedding.last_lookup = None

    def state_dict(self) -> dict:
        return {"param_groups": [dict(g) for g in self.param_groups]}

    def load_state_dict(self, state: dict) -> None:
        self.param_groups = [dict(g) for g in state["param_groups"]]
