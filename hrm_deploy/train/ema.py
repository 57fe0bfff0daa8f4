"""Exponential moving average of the trainable weights, as upstream TRM's ``models/ema.py``
(``ema: True`` in its config): after every optimizer step ``shadow = (1 - rate) * param +
rate * shadow``; evaluation and checkpoints use a copy of the model holding the shadow
weights (buffers such as the puzzle-embedding table are the live ones, as upstream's copy)."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


class EMA:
    """Shadow copies of ``model``'s trainable parameters, keyed by parameter name."""

    def __init__(self, model: nn.Module, rate: float, shadow: dict[str, torch.Tensor] | None = None):
        self.rate = float(rate)
        params = {n: p for n, p in model.named_parameters() if p.requires_grad}
        if shadow is None:
            self.shadow = {n: p.detach().clone() for n, p in params.items()}
        else:
            self.shadow = {n: shadow[n].to(device=p.device, dtype=p.dtype).clone() for n, p in params.items()}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for name, param in model.named_parameters():
            if param.requires_grad:
                # upstream's expression, kept as written so the rounding matches
                self.shadow[name] = (1.0 - self.rate) * param.detach() + self.rate * self.shadow[name]

    def copy_of(self, model: nn.Module) -> Any:
        """A deep copy of ``model`` holding the shadow weights (upstream ``ema_copy``)."""
        twin = copy.deepcopy(model)
        with torch.no_grad():
            for name, param in twin.named_parameters():
                if name in self.shadow:
                    param.copy_(self.shadow[name])
        return twin
