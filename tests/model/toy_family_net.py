"""The toy family's network (torch), kept apart from its config as a real family keeps it."""

from __future__ import annotations

import torch
from torch import nn

from hrm_deploy.model.hrm import HRMACT, Carry, HRMCore
from hrm_deploy.model.layers import SwiGLU, rms_norm


class ToyBlock(nn.Module):
    """``h + SwiGLU(rms_norm(h))``: a pre-norm MLP, each position alone."""

    def __init__(self, hidden: int, inter: int, eps: float):
        super().__init__()
        self.mlp = SwiGLU(hidden, inter)
        self.eps = eps

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.mlp(rms_norm(h, self.eps))


class ToyCore(HRMCore):
    def build_levels(self) -> None:
        cfg = self.config
        self.toy_level = nn.ModuleList(
            ToyBlock(cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps) for _ in range(cfg.L_layers)
        )

    def recur(self, carry: Carry, x: torch.Tensor) -> Carry:
        z_H, z_L = carry.z_H, carry.z_L
        for _ in range(self.config.H_cycles):
            z_L = z_L + z_H + x
            for block in self.toy_level:
                z_L = block(z_L)
            z_H = rms_norm(z_H + z_L, self.config.rms_norm_eps)
        return Carry(z_H, z_L)


class ToyACT(HRMACT):
    core_class = ToyCore
