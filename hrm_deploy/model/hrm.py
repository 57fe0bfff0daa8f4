"""The HRM reference model: one ACT segment (:class:`HRMCore`) and the ACT wrapper
(:class:`HRMACT`) with upstream's carry semantics.

Shapes: B batch, S = seq_len, P = puzzle_emb_len, T = S + P, D = hidden_size, V = vocab.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.layers import CastedEmbedding, CastedLinear, ReasoningModule, RotaryTables, trunc_normal_

# Upstream scales learned positions by 1/sqrt(2) written out to 9 digits; keep the literal.
LEARNED_POS_SCALE = 0.707106781


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}[
        name
    ]


class PuzzleEmbedding(nn.Module):
    """Per-puzzle embedding rows kept in a *buffer* (``weights``), as upstream.

    In eval it is a plain lookup. In training, the looked-up rows become a fresh leaf
    tensor whose gradient the sign-SGD optimizer reads (``last_lookup``): only touched
    rows are updated, and the table never enters ``parameters()``.
    """

    weights: torch.Tensor  # buffer [num_ids, dim]

    def __init__(self, num_ids: int, dim: int):
        super().__init__()
        self.register_buffer("weights", torch.zeros(num_ids, dim))
        self.last_lookup: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.long()  # int64 indices: ORT rejects int32 GatherND from some exporters
        if not (self.training and torch.is_grad_enabled()):
            return F.embedding(ids, self.weights)
        rows = self.weights[ids].detach().requires_grad_(True)
        self.last_lookup = (ids, rows)
        return rows


@dataclass
class Carry:
    """Recurrent state of one ACT segment: [B, T, D] each."""

    z_H: torch.Tensor
    z_L: torch.Tensor


class HRMCore(nn.Module):
    """One ACT segment of HRM (upstream ``HierarchicalReasoningModel_ACTV1_Inner``)."""

    H_init: torch.Tensor  # buffers [D]
    L_init: torch.Tensor
    L_level: nn.Module  # the family's reasoning networks (build_levels)

    def __init__(self, config: HRMConfig):
        super().__init__()
        self.config = config
        self.compute_dtype = torch_dtype(config.forward_dtype)
        d = config.hidden_size
        self.embed_scale = math.sqrt(d)
        embed_std = 1.0 / self.embed_scale

        self.embed_tokens = CastedEmbedding(config.vocab_size, d, init_std=embed_std)
        self.lm_head = CastedLinear(d, config.vocab_size, bias=False)
        self.q_head = CastedLinear(d, 2, bias=True)
        self.puzzle_emb_len = config.puzzle_emb_len
        if config.puzzle_emb_ndim > 0:
            self.puzzle_emb = PuzzleEmbedding(config.num_puzzle_identifiers, config.puzzle_emb_ndim)
        if config.pos_encodings == "rope":
            self.rotary_emb = RotaryTables(config.head_dim, config.total_seq_len, config.rope_theta)
        elif config.pos_encodings == "learned":
            self.embed_pos = CastedEmbedding(config.total_seq_len, d, init_std=embed_std)
        self.build_levels()
        # Upstream keeps the initial states in bf16 (its forward dtype). Ours are float32
        # buffers holding bf16-representable values, so both checkpoint formats are lossless.
        self.register_buffer("H_init", trunc_normal_(torch.empty(d), std=1.0).bfloat16().float())
        self.register_buffer("L_init", trunc_normal_(torch.empty(d), std=1.0).bfloat16().float())
        with torch.no_grad():  # Q head starts at "never halt": weight 0, bias -5.
            self.q_head.weight.zero_()
            assert self.q_head.bias is not None  # built with bias=True just above
            self.q_head.bias.fill_(-5.0)

    def build_levels(self) -> None:
        """The reasoning networks (a family's own part): HRM has an H and an L level."""
        cfg = self.config

        def level(layers: int) -> ReasoningModule:
            return ReasoningModule(layers, cfg.hidden_size, cfg.num_heads, cfg.intermediate_size, cfg.rms_norm_eps)

        self.H_level = level(cfg.H_layers)
        self.L_level = level(cfg.L_layers)

    # -- pieces, also used by the exporter --------------------------------------------------
    def rope(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.config.pos_encodings != "rope":
            return None
        return self.rotary_emb.cos_cached, self.rotary_emb.sin_cached

    def input_embeddings(self, inputs: torch.Tensor, puzzle_identifiers: torch.Tensor) -> torch.Tensor:
        """Token (+ puzzle prefix, + learned position) embedding, scaled by sqrt(D): [B, T, D]."""
        rows = self.puzzle_emb(puzzle_identifiers) if self.config.puzzle_emb_ndim > 0 else None
        return self.embed_with_rows(inputs, rows)

    def embed_with_rows(self, inputs: torch.Tensor, puzzle_rows: torch.Tensor | None) -> torch.Tensor:
        """:meth:`input_embeddings` from the puzzle-embedding rows already looked up, [B,
        puzzle_emb_ndim] (None without a table): the graph of an external-table export."""
        dtype = self.compute_dtype
        emb = self.embed_tokens(inputs.long(), dtype)
        if self.config.puzzle_emb_ndim > 0:
            assert puzzle_rows is not None  # a model with a table always looks its rows up
            puzzle = puzzle_rows.to(dtype)
            pad = self.puzzle_emb_len * self.config.hidden_size - puzzle.shape[-1]
            if pad > 0:
                # zero padding as F.pad(puzzle, (0, pad)) does; a concatenation, because onnxslim's
                # constant folding of the traced Pad's computed pads gives wrong pads (seen with TRM's
                # 16-position prefix)
                puzzle = torch.cat((puzzle, torch.zeros_like(puzzle[:, :1]).expand(-1, pad)), dim=-1)
            emb = torch.cat((puzzle.view(-1, self.puzzle_emb_len, self.config.hidden_size), emb), dim=-2)
        if self.config.pos_encodings == "learned":
            emb = LEARNED_POS_SCALE * (emb + self.embed_pos.embedding_weight.to(dtype))
        return self.embed_scale * emb

    def initial_state(self, batch: int, device=None) -> Carry:
        """The reset carry: H_init / L_init broadcast to [B, T, D]."""
        shape = (batch, self.config.total_seq_len, self.config.hidden_size)
        z_H = self.H_init.to(device=device, dtype=self.compute_dtype).expand(shape)
        z_L = self.L_init.to(device=device, dtype=self.compute_dtype).expand(shape)
        return Carry(z_H, z_L)

    def reset_carry(self, reset: torch.Tensor, carry: Carry) -> Carry:
        """Rows where ``reset`` is True go back to the initial state (upstream ``reset_carry``)."""
        mask = reset.view(-1, 1, 1)
        init = self.initial_state(1, carry.z_H.device)
        return Carry(torch.where(mask, init.z_H, carry.z_H), torch.where(mask, init.z_L, carry.z_L))

    def recur(self, carry: Carry, x: torch.Tensor) -> Carry:
        """The H/L cycles of one segment. Only the last L and H calls carry gradient
        (upstream's one-step gradient); with 2x2 cycles the order is L, L, H, L | L, H."""
        cfg, rope = self.config, self.rope()
        z_H, z_L = carry.z_H, carry.z_L
        with torch.no_grad():
            for h_step in range(cfg.H_cycles):
                for l_step in range(cfg.L_cycles):
                    if not (h_step == cfg.H_cycles - 1 and l_step == cfg.L_cycles - 1):
                        z_L = self.L_level(z_L, z_H + x, rope)
                if h_step != cfg.H_cycles - 1:
                    z_H = self.H_level(z_H, z_L, rope)
        z_L = self.L_level(z_L, z_H + x, rope)
        z_H = self.H_level(z_H, z_L, rope)
        return Carry(z_H, z_L)

    def heads(self, z_H: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """logits [B, S, V] (prefix tokens dropped), q_halt [B], q_continue [B] (float32)."""
        logits = self.lm_head(z_H)[:, self.puzzle_emb_len :]
        q = self.q_head(z_H[:, 0]).to(torch.promote_types(z_H.dtype, torch.float32))
        return logits, q[..., 0], q[..., 1]

    def forward(self, carry: Carry, inputs: torch.Tensor, puzzle_identifiers: torch.Tensor):
        """One ACT segment: returns (new detached carry, logits, (q_halt, q_continue))."""
        x = self.input_embeddings(inputs, puzzle_identifiers)
        carry = self.recur(carry, x)
        logits, q_halt, q_continue = self.heads(carry.z_H)
        return Carry(carry.z_H.detach(), carry.z_L.detach()), logits, (q_halt, q_continue)


@dataclass
class ACTCarry:
    """Upstream ``HierarchicalReasoningModel_ACTV1Carry``: inner carry, steps, halted, data."""

    inner: Carry
    steps: torch.Tensor
    halted: torch.Tensor
    current_data: dict[str, torch.Tensor]


class HRMACT(nn.Module):
    """ACT wrapper with upstream's semantics (``HierarchicalReasoningModel_ACTV1``).

    Its state dict keys are ``inner.*``, one of the prefixes the loader accepts.
    In eval every row runs exactly ``halt_max_steps`` segments; in training rows halt on
    ``q_halt > q_continue`` with exploration and the bootstrapped Q target is returned.
    """

    checkpoint_info: dict[str, Any]  # set by load_checkpoint: the loaded file's description
    core_class: type[HRMCore] = HRMCore  # the family's one-segment core

    def __init__(self, config: HRMConfig):
        super().__init__()
        self.config = config
        self.inner = self.core_class(config)

    def initial_carry(self, batch: dict[str, torch.Tensor]) -> ACTCarry:
        size = batch["inputs"].shape[0]
        device = batch["inputs"].device
        # Upstream leaves z uninitialised (torch.empty); every row starts halted, so it is
        # reset before use. Zeros make that explicit and keep NaNs out of where().
        shape = (size, self.config.total_seq_len, self.config.hidden_size)
        zeros = torch.zeros(shape, dtype=self.inner.compute_dtype, device=device)
        return ACTCarry(
            inner=Carry(zeros, zeros.clone()),
            steps=torch.zeros(size, dtype=torch.int32, device=device),
            halted=torch.ones(size, dtype=torch.bool, device=device),
            current_data={k: torch.zeros_like(v) for k, v in batch.items()},
        )

    def forward(self, carry: ACTCarry, batch: dict[str, torch.Tensor]):
        halted = carry.halted
        inner = self.inner.reset_carry(halted, carry.inner)
        steps = torch.where(halted, 0, carry.steps)
        data = {
            k: torch.where(halted.view((-1,) + (1,) * (batch[k].ndim - 1)), batch[k], v)
            for k, v in carry.current_data.items()
        }
        inner, logits, (q_halt, q_continue) = self.inner(inner, data["inputs"], data["puzzle_identifiers"])
        outputs = {"logits": logits, "q_halt_logits": q_halt, "q_continue_logits": q_continue}
        with torch.no_grad():
            steps = steps + 1
            is_last = steps >= self.config.halt_max_steps
            halted = is_last
            if self.training and self.config.halt_max_steps > 1:
                if self.config.halts_on_q_halt_alone:  # TRM's no_ACT_continue: the continue logit is unused
                    halted = halted | (q_halt > 0)
                else:
                    halted = halted | (q_halt > q_continue)
                explore = torch.rand_like(q_halt) < self.config.halt_exploration_prob
                min_steps = explore * torch.randint_like(steps, low=2, high=self.config.halt_max_steps + 1)
                halted = halted & (steps >= min_steps)
                if self.config.halts_on_q_halt_alone:
                    return ACTCarry(inner, steps, halted, data), outputs
                # Bootstrapped target: Q of the next segment, no replay buffer or target net.
                _, _, (next_halt, next_continue) = self.inner(inner, data["inputs"], data["puzzle_identifiers"])
                outputs["target_q_continue"] = torch.sigmoid(
                    torch.where(is_last, next_halt, torch.maximum(next_halt, next_continue))
                )
        return ACTCarry(inner, steps, halted, data), outputs


def build_model(config: HRMConfig, seed: int | None = None) -> HRMACT:
    """A freshly initialised model of ``config``'s family (upstream's init), optionally seeded."""
    from hrm_deploy.model.families import family_of

    act_class = family_of(config).act_class()
    if seed is None:
        return act_class(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return act_class(config)
