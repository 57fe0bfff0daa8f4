"""The Tiny Recursive Model (upstream ``models/recursive_reasoning/trm.py``) as a model family.

TRM shares HRM's input embedding, initial states, heads and ACT wrapper; what differs is the
reasoning network and its recursion. One network (``L_level``, ``L_layers`` post-norm blocks)
is applied ``H_cycles`` (T) times { ``L_cycles`` (n) times ``z_L = net(z_L, z_H + x)``, then
``z_H = net(z_H, z_L)`` }: T*(n+1) passes per ACT step. Only the last of the T cycles carries
gradient in training. With ``mlp_t`` a block mixes positions with a SwiGLU applied along the
sequence axis (width T_seq = seq_len + puzzle_emb_len) instead of attention.

Shapes: B batch, T_seq = seq_len + puzzle_emb_len, D = hidden_size.
"""

from __future__ import annotations

import torch
from torch import nn

from hrm_deploy.model.hrm import HRMACT, Carry, HRMCore
from hrm_deploy.model.layers import Attention, SwiGLU, rms_norm
from hrm_deploy.model.trm_config import TRMConfig


class TRMBlock(nn.Module):
    """Upstream ``TinyRecursiveReasoningModel_ACTV1Block``: post-norm, token mixing by
    attention (RoPE or none) or, with ``mlp_t``, a SwiGLU over the sequence axis whose
    residual is normalised over positions (upstream takes it in the transposed [B, D, T_seq]
    layout), then the channel SwiGLU."""

    def __init__(self, config: TRMConfig):
        super().__init__()
        self.use_mlp_t = config.mlp_t
        if config.mlp_t:
            self.mlp_t = SwiGLU(config.total_seq_len, config.mlp_t_intermediate_size)
        else:
            self.self_attn = Attention(config.hidden_size, config.num_heads)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)
        self.eps = config.rms_norm_eps

    def forward(self, h: torch.Tensor, rope) -> torch.Tensor:
        if self.use_mlp_t:
            # upstream: t = h.transpose(1, 2); t = rms_norm(t + mlp_t(t)); h = t.transpose(1, 2).
            # The same math with the norm taken over the position axis of [B, T_seq, D]: the graph
            # then has no last-axis norm of width T_seq that a hidden-size RMSNorm fusion could take.
            mixed = self.mlp_t(h.transpose(1, 2)).transpose(1, 2)  # SwiGLU over positions, per channel
            h = rms_norm(h + mixed, self.eps, dim=1)
        else:
            h = rms_norm(h + self.self_attn(h, rope), self.eps)
        return rms_norm(h + self.mlp(h), self.eps)


class TRMReasoningModule(nn.Module):
    """``layers(h + injection)`` over TRM blocks (upstream ``..._ReasoningModule``)."""

    def __init__(self, config: TRMConfig):
        super().__init__()
        self.layers = nn.ModuleList(TRMBlock(config) for _ in range(config.L_layers))

    def forward(self, h: torch.Tensor, injection: torch.Tensor, rope) -> torch.Tensor:
        h = h + injection
        for layer in self.layers:
            h = layer(h, rope)
        return h


class TRMCore(HRMCore):
    """One ACT segment of TRM (upstream ``TinyRecursiveReasoningModel_ACTV1_Inner``)."""

    config: TRMConfig

    def build_levels(self) -> None:
        self.L_level = TRMReasoningModule(self.config)

    def recur(self, carry: Carry, x: torch.Tensor) -> Carry:
        """T cycles of (n L updates, one H update), all through ``L_level``; the first T-1
        cycles run without gradient, the last one with (upstream's deep recursion)."""
        cfg, rope = self.config, self.rope()
        z_H, z_L = carry.z_H, carry.z_L
        with torch.no_grad():
            for _ in range(cfg.H_cycles - 1):
                for _ in range(cfg.L_cycles):
                    z_L = self.L_level(z_L, z_H + x, rope)
                z_H = self.L_level(z_H, z_L, rope)
        for _ in range(cfg.L_cycles):
            z_L = self.L_level(z_L, z_H + x, rope)
        z_H = self.L_level(z_H, z_L, rope)
        return Carry(z_H, z_L)


class TRMACT(HRMACT):
    """ACT wrapper of TRM: HRM's carry semantics; in training rows halt on ``q_halt > 0``
    when ``no_ACT_continue`` (no bootstrapped continue target), else as HRM."""

    core_class = TRMCore
