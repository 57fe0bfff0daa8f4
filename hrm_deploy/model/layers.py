"""Building blocks of the HRM reference model.

The math matches upstream ``models/layers.py`` exactly (post-norm blocks, weightless
RMSNorm in float32, rotate-half RoPE in float32, SwiGLU, fp32 weights cast to the
compute dtype per op); attention is ``F.scaled_dot_product_attention`` instead of
FlashAttention (same semantics: non-causal, no mask, scale 1/sqrt(head_dim)).
Parameter names match upstream's state-dict keys so checkpoints load unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def trunc_normal_(tensor: torch.Tensor, std: float = 1.0, lower: float = -2.0, upper: float = 2.0) -> torch.Tensor:
    """JAX-style truncated normal: ``std`` is the std of the *truncated* distribution
    (upstream's ``trunc_normal_init_``), truncated at ``lower``/``upper`` std units."""
    if std == 0:
        return tensor.zero_()
    c = (2 * math.pi) ** -0.5
    z = (math.erf(upper / math.sqrt(2)) - math.erf(lower / math.sqrt(2))) / 2
    pdf_u, pdf_l = c * math.exp(-0.5 * upper**2), c * math.exp(-0.5 * lower**2)
    comp_std = std / math.sqrt(1 - (upper * pdf_u - lower * pdf_l) / z - ((pdf_u - pdf_l) / z) ** 2)
    with torch.no_grad():
        return nn.init.trunc_normal_(tensor, 0.0, comp_std, lower * comp_std, upper * comp_std)


def _at_least_float32(dtype: torch.dtype) -> torch.dtype:
    # Norm and RoPE math runs in float32 (or float64 when the whole model does).
    return torch.promote_types(dtype, torch.float32)


def rms_norm(x: torch.Tensor, eps: float, dim: int = -1) -> torch.Tensor:
    """Weightless RMSNorm over ``dim`` computed in (at least) float32, returned in the input dtype."""
    dtype = x.dtype
    x = x.to(_at_least_float32(dtype))
    x = x * torch.rsqrt(x.square().mean(dim, keepdim=True) + eps)
    return x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotate-half RoPE on [B, S, heads, head_dim] tensors, in float32."""
    dtype = q.dtype
    work = _at_least_float32(dtype)
    q, k = q.to(work), k.to(work)
    cos, sin = cos.to(work).unsqueeze(-2), sin.to(work).unsqueeze(-2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    return q.to(dtype), k.to(dtype)


class CastedLinear(nn.Module):
    """Linear layer with float32 master weights cast to the input dtype per call."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(trunc_normal_(torch.empty(out_features, in_features), std=in_features**-0.5))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        return F.linear(x, self.weight.to(x.dtype), bias)


class CastedEmbedding(nn.Module):
    """Embedding table with float32 master weights cast to ``dtype`` on lookup."""

    def __init__(self, num_embeddings: int, dim: int, init_std: float):
        super().__init__()
        self.embedding_weight = nn.Parameter(trunc_normal_(torch.empty(num_embeddings, dim), std=init_std))

    def forward(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return F.embedding(ids, self.embedding_weight.to(dtype))


class RotaryTables(nn.Module):
    """Precomputed cos/sin tables (not saved: upstream's are non-persistent too)."""

    cos_cached: torch.Tensor  # buffers [max_positions, head_dim]
    sin_cached: torch.Tensor

    def __init__(self, head_dim: int, max_positions: int, base: float):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)


class Attention(nn.Module):
    """Bidirectional multi-head attention; qkv rows are [Q | K | V] as upstream."""

    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.qkv_proj = CastedLinear(hidden_size, 3 * hidden_size, bias=False)
        self.o_proj = CastedLinear(hidden_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        batch, seq, width = x.shape
        qkv = self.qkv_proj(x).view(batch, seq, 3 * self.num_heads, self.head_dim)
        q, k, v = qkv.split(self.num_heads, dim=2)  # each [B, S, heads, head_dim]
        if rope is not None:
            q, k = apply_rotary(q, k, *rope)
        # SDPA wants [B, heads, S, head_dim]; default scale is 1/sqrt(head_dim) as upstream.
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, width))


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_up_proj = CastedLinear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = CastedLinear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Block(nn.Module):
    """Post-norm transformer block: h = norm(h + attn(h)); h = norm(h + mlp(h))."""

    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int, eps: float):
        super().__init__()
        self.self_attn = Attention(hidden_size, num_heads)
        self.mlp = SwiGLU(hidden_size, intermediate_size)
        self.eps = eps

    def forward(self, h: torch.Tensor, rope) -> torch.Tensor:
        h = rms_norm(h + self.self_attn(h, rope), self.eps)
        return rms_norm(h + self.mlp(h), self.eps)


class ReasoningModule(nn.Module):
    """A stack of blocks whose input is the state plus an injection: layers(h + injection)."""

    def __init__(self, num_layers: int, hidden_size: int, num_heads: int, intermediate_size: int, eps: float):
        super().__init__()
        self.layers = nn.ModuleList(Block(hidden_size, num_heads, intermediate_size, eps) for _ in range(num_layers))

    def forward(self, h: torch.Tensor, injection: torch.Tensor, rope) -> torch.Tensor:
        h = h + injection
        for layer in self.layers:
            h = layer(h, rope)
        return h
