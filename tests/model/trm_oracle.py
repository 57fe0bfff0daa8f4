"""The reference: upstream TinyRecursiveModels' forward code (models/layers.py, models/
recursive_reasoning/trm.py), copied with only these changes: pydantic config -> a plain
namespace, einops.rearrange -> the equivalent permute, sparse embedding -> its eval lookup,
init code dropped (weights are loaded). Used as the oracle the toolkit's TRM must equal."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.functional import scaled_dot_product_attention


def _find_multiple(a, b):
    return (-(a // -b)) * b


def rotate_half(x: torch.Tensor):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    orig_dtype = q.dtype
    q = q.to(cos.dtype)
    k = k.to(cos.dtype)
    q_embed = (q * cos.unsqueeze(-2)) + (rotate_half(q) * sin.unsqueeze(-2))
    k_embed = (k * cos.unsqueeze(-2)) + (rotate_half(k) * sin.unsqueeze(-2))
    return q_embed.to(orig_dtype), k_embed.to(orig_dtype)


class CastedLinear(nn.Module):
    def __init__(self, in_features, out_features, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.empty((out_features, in_features)))
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.zeros((out_features,)))

    def forward(self, input):
        return F.linear(
            input, self.weight.to(input.dtype), bias=self.bias.to(input.dtype) if self.bias is not None else None
        )


class CastedEmbedding(nn.Module):
    def __init__(self, num_embeddings, embedding_dim, cast_to):
        super().__init__()
        self.cast_to = cast_to
        self.embedding_weight = nn.Parameter(torch.empty((num_embeddings, embedding_dim)))

    def forward(self, input):
        return F.embedding(input, self.embedding_weight.to(self.cast_to))


class CastedSparseEmbedding(nn.Module):
    def __init__(self, num_embeddings, embedding_dim, cast_to):
        super().__init__()
        self.cast_to = cast_to
        self.weights = nn.Buffer(torch.zeros((num_embeddings, embedding_dim)), persistent=True)

    def forward(self, inputs):
        return self.weights[inputs].to(self.cast_to)


class RotaryEmbedding(nn.Module):
    def __init__(self, dim, max_position_embeddings, base):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        t = torch.arange(max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos_cached = nn.Buffer(emb.cos(), persistent=False)
        self.sin_cached = nn.Buffer(emb.sin(), persistent=False)

    def forward(self):
        return self.cos_cached, self.sin_cached


class Attention(nn.Module):
    def __init__(self, hidden_size, head_dim, num_heads, num_key_value_heads, causal=False):
        super().__init__()
        self.hidden_size = hidden_size
        self.head_dim = head_dim
        self.output_size = head_dim * num_heads
        self.num_heads = num_heads
        self.num_key_value_heads = num_key_value_heads
        self.causal = causal
        self.qkv_proj = CastedLinear(
            self.hidden_size, (self.num_heads + 2 * self.num_key_value_heads) * self.head_dim, bias=False
        )
        self.o_proj = CastedLinear(self.output_size, self.hidden_size, bias=False)

    def forward(self, cos_sin, hidden_states):
        batch_size, seq_len, _ = hidden_states.shape
        qkv = self.qkv_proj(hidden_states)
        qkv = qkv.view(batch_size, seq_len, self.num_heads + 2 * self.num_key_value_heads, self.head_dim)
        query = qkv[:, :, : self.num_heads]
        key = qkv[:, :, self.num_heads : self.num_heads + self.num_key_value_heads]
        value = qkv[:, :, self.num_heads + self.num_key_value_heads :]
        if cos_sin is not None:
            cos, sin = cos_sin
            query, key = apply_rotary_pos_emb(query, key, cos, sin)
        query, key, value = (t.permute(0, 2, 1, 3) for t in (query, key, value))  # 'B S H D -> B H S D'
        attn_output = scaled_dot_product_attention(query=query, key=key, value=value, is_causal=self.causal)
        attn_output = attn_output.permute(0, 2, 1, 3)  # 'B H S D -> B S H D'
        attn_output = attn_output.reshape(batch_size, seq_len, self.output_size)
        return self.o_proj(attn_output)


class SwiGLU(nn.Module):
    def __init__(self, hidden_size, expansion):
        super().__init__()
        inter = _find_multiple(round(expansion * hidden_size * 2 / 3), 256)
        self.gate_up_proj = CastedLinear(hidden_size, inter * 2, bias=False)
        self.down_proj = CastedLinear(inter, hidden_size, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def rms_norm(hidden_states, variance_epsilon):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(torch.float32)
    variance = hidden_states.square().mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + variance_epsilon)
    return hidden_states.to(input_dtype)


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        if self.config.mlp_t:
            self.puzzle_emb_len = (
                -(self.config.puzzle_emb_ndim // -self.config.hidden_size)
                if self.config.puzzle_emb_len == 0
                else self.config.puzzle_emb_len
            )
            self.mlp_t = SwiGLU(hidden_size=self.config.seq_len + self.puzzle_emb_len, expansion=config.expansion)
        else:
            self.self_attn = Attention(
                hidden_size=config.hidden_size,
                head_dim=config.hidden_size // config.num_heads,
                num_heads=config.num_heads,
                num_key_value_heads=config.num_heads,
                causal=False,
            )
        self.mlp = SwiGLU(hidden_size=config.hidden_size, expansion=config.expansion)
        self.norm_eps = config.rms_norm_eps

    def forward(self, cos_sin, hidden_states):
        if self.config.mlp_t:
            hidden_states = hidden_states.transpose(1, 2)
            out = self.mlp_t(hidden_states)
            hidden_states = rms_norm(hidden_states + out, variance_epsilon=self.norm_eps)
            hidden_states = hidden_states.transpose(1, 2)
        else:
            hidden_states = rms_norm(
                hidden_states + self.self_attn(cos_sin=cos_sin, hidden_states=hidden_states),
                variance_epsilon=self.norm_eps,
            )
        out = self.mlp(hidden_states)
        hidden_states = rms_norm(hidden_states + out, variance_epsilon=self.norm_eps)
        return hidden_states


class ReasoningModule(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, hidden_states, input_injection, **kwargs):
        hidden_states = hidden_states + input_injection
        for layer in self.layers:
            hidden_states = layer(hidden_states=hidden_states, **kwargs)
        return hidden_states


class Inner(nn.Module):
    """Upstream ``TinyRecursiveReasoningModel_ACTV1_Inner``."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.forward_dtype = getattr(torch, self.config.forward_dtype)
        self.embed_scale = math.sqrt(self.config.hidden_size)
        self.embed_tokens = CastedEmbedding(self.config.vocab_size, self.config.hidden_size, cast_to=self.forward_dtype)
        self.lm_head = CastedLinear(self.config.hidden_size, self.config.vocab_size, bias=False)
        self.q_head = CastedLinear(self.config.hidden_size, 2, bias=True)
        self.puzzle_emb_len = (
            -(self.config.puzzle_emb_ndim // -self.config.hidden_size)
            if self.config.puzzle_emb_len == 0
            else self.config.puzzle_emb_len
        )
        if self.config.puzzle_emb_ndim > 0:
            self.puzzle_emb = CastedSparseEmbedding(
                self.config.num_puzzle_identifiers, self.config.puzzle_emb_ndim, cast_to=self.forward_dtype
            )
        if self.config.pos_encodings == "rope":
            self.rotary_emb = RotaryEmbedding(
                dim=self.config.hidden_size // self.config.num_heads,
                max_position_embeddings=self.config.seq_len + self.puzzle_emb_len,
                base=self.config.rope_theta,
            )
        elif self.config.pos_encodings == "learned":
            self.embed_pos = CastedEmbedding(
                self.config.seq_len + self.puzzle_emb_len, self.config.hidden_size, cast_to=self.forward_dtype
            )
        self.L_level = ReasoningModule(layers=[Block(self.config) for _i in range(self.config.L_layers)])
        self.H_init = nn.Buffer(torch.empty(self.config.hidden_size, dtype=self.forward_dtype), persistent=True)
        self.L_init = nn.Buffer(torch.empty(self.config.hidden_size, dtype=self.forward_dtype), persistent=True)

    def _input_embeddings(self, input, puzzle_identifiers):
        embedding = self.embed_tokens(input.to(torch.int32))
        if self.config.puzzle_emb_ndim > 0:
            puzzle_embedding = self.puzzle_emb(puzzle_identifiers)
            pad_count = self.puzzle_emb_len * self.config.hidden_size - puzzle_embedding.shape[-1]
            if pad_count > 0:
                puzzle_embedding = F.pad(puzzle_embedding, (0, pad_count))
            embedding = torch.cat(
                (puzzle_embedding.view(-1, self.puzzle_emb_len, self.config.hidden_size), embedding), dim=-2
            )
        if self.config.pos_encodings == "learned":
            embedding = 0.707106781 * (embedding + self.embed_pos.embedding_weight.to(self.forward_dtype))
        return self.embed_scale * embedding

    def reset_carry(self, reset_flag, carry):
        return SimpleNamespace(
            z_H=torch.where(reset_flag.view(-1, 1, 1), self.H_init, carry.z_H),
            z_L=torch.where(reset_flag.view(-1, 1, 1), self.L_init, carry.z_L),
        )

    def forward(self, carry, batch):
        seq_info = dict(cos_sin=self.rotary_emb() if hasattr(self, "rotary_emb") else None)
        input_embeddings = self._input_embeddings(batch["inputs"], batch["puzzle_identifiers"])
        z_H, z_L = carry.z_H, carry.z_L
        with torch.no_grad():
            for _H_step in range(self.config.H_cycles - 1):
                for _L_step in range(self.config.L_cycles):
                    z_L = self.L_level(z_L, z_H + input_embeddings, **seq_info)
                z_H = self.L_level(z_H, z_L, **seq_info)
        for _L_step in range(self.config.L_cycles):
            z_L = self.L_level(z_L, z_H + input_embeddings, **seq_info)
        z_H = self.L_level(z_H, z_L, **seq_info)
        new_carry = SimpleNamespace(z_H=z_H.detach(), z_L=z_L.detach())
        output = self.lm_head(z_H)[:, self.puzzle_emb_len :]
        q_logits = self.q_head(z_H[:, 0]).to(torch.float32)
        return new_carry, output, (q_logits[..., 0], q_logits[..., 1])


@torch.no_grad()
def upstream_eval(inner: Inner, inputs: torch.Tensor, puzzle_identifiers: torch.Tensor, halt_max_steps: int):
    """Upstream's ACT wrapper in eval (every row runs halt_max_steps; the first call resets
    all rows to H_init/L_init): final logits and per-step q_halt / q_continue [B, steps]."""
    batch = {"inputs": inputs, "puzzle_identifiers": puzzle_identifiers}
    size = inputs.shape[0]
    shape = (size, inner.config.seq_len + inner.puzzle_emb_len, inner.config.hidden_size)
    carry = SimpleNamespace(
        z_H=torch.zeros(shape, dtype=inner.forward_dtype), z_L=torch.zeros(shape, dtype=inner.forward_dtype)
    )
    carry = inner.reset_carry(torch.ones(size, dtype=torch.bool), carry)
    halts, conts = [], []
    for _ in range(halt_max_steps):
        carry, logits, (q_halt, q_continue) = inner(carry, batch)
        halts.append(q_halt)
        conts.append(q_continue)
    return logits, torch.stack(halts, 1), torch.stack(conts, 1)


def build_oracle(arch: dict, dataset: dict, state: dict[str, torch.Tensor], dtype: str = "float32") -> Inner:
    """The upstream inner model from an all_config.yaml ``arch`` section, dataset.json fields and
    a prefix-free state dict, computing in ``dtype`` (forward_dtype overridden as for export;
    float64 gives the noise-floor reference)."""
    fields = {k: v for k, v in arch.items() if k not in ("name", "loss")}
    fields.setdefault("rms_norm_eps", 1e-5)
    fields.setdefault("rope_theta", 10000.0)
    fields.update(dataset, forward_dtype=dtype)
    inner = Inner(SimpleNamespace(**fields))
    inner.load_state_dict({k: v.to(getattr(torch, dtype)) for k, v in state.items()}, strict=True)
    if dtype == "float64":
        inner = inner.double()
    return inner.eval()
