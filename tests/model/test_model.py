import math

import torch

from hrm_deploy.model.hrm import build_model
from hrm_deploy.model.layers import apply_rotary, rms_norm


def test_state_dict_keys_are_upstreams(tiny_model):
    keys = set(tiny_model.state_dict())
    assert "inner.H_init" in keys and "inner.puzzle_emb.weights" in keys
    assert "inner.H_level.layers.1.self_attn.qkv_proj.weight" in keys
    assert "inner.L_level.layers.0.mlp.gate_up_proj.weight" in keys
    assert not any("rotary" in k or "cos_cached" in k for k in keys)  # non-persistent, as upstream
    assert tiny_model.inner.q_head.bias.shape == (2,)


def test_fresh_q_head_is_never_halt(tiny_config):
    m = build_model(tiny_config, seed=0)
    assert torch.all(m.inner.q_head.weight == 0) and torch.all(m.inner.q_head.bias == -5)


def test_rms_norm_runs_in_float32_and_has_no_weight():
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16) * 100
    y = rms_norm(x, 1e-5)
    assert y.dtype == torch.bfloat16
    ref = x.float() / torch.sqrt(x.float().square().mean(-1, keepdim=True) + 1e-5)
    assert torch.allclose(y.float(), ref, atol=0.02, rtol=0.01)


def test_rope_is_rotate_half_layout():
    q = torch.zeros(1, 1, 1, 4)
    q[..., 0] = 1.0  # first half, dim 0 pairs with dim 2 in rotate-half layout
    cos = torch.full((1, 4), math.cos(0.3))
    sin = torch.full((1, 4), math.sin(0.3))
    out, _ = apply_rotary(q, q.clone(), cos, sin)
    assert torch.allclose(out[0, 0, 0], torch.tensor([math.cos(0.3), 0, math.sin(0.3), 0]), atol=1e-6)


def test_embedding_scale_and_prefix(tiny_model):
    core = tiny_model.inner
    ids = torch.tensor([[1, 2] + [0] * 79])
    pid = torch.tensor([0])
    with torch.no_grad():
        x = core.input_embeddings(ids, pid)
    assert x.shape == (1, 82, 64)
    scale = math.sqrt(64)
    assert torch.allclose(x[0, 0], scale * core.puzzle_emb.weights[0])
    assert torch.allclose(x[0, 1], scale * core.embed_tokens.embedding_weight[1])


def test_learned_positions_variant(tiny_config):
    cfg = tiny_config.replace(pos_encodings="learned")
    m = build_model(cfg, seed=0).eval()
    assert m.inner.embed_pos.embedding_weight.shape == (82, 64)
    with torch.no_grad():
        _, logits, _ = m.inner(
            m.inner.initial_state(2), torch.zeros(2, 81, dtype=torch.long), torch.zeros(2, dtype=torch.long)
        )
    assert logits.shape == (2, 81, 11)


def test_bfloat16_forward_mirrors_upstream_dtypes(tiny_model):
    core = tiny_model.inner
    core.compute_dtype = torch.bfloat16
    with torch.no_grad():
        carry, logits, (q_halt, _) = core(
            core.initial_state(2), torch.ones(2, 81, dtype=torch.long), torch.zeros(2, dtype=torch.long)
        )
    assert logits.dtype == torch.bfloat16 and carry.z_H.dtype == torch.bfloat16
    assert q_halt.dtype == torch.float32  # Q logits upcast, as upstream


def test_act_training_halts_by_q_and_returns_target(tiny_model):
    tiny_model.train()
    batch = {"inputs": torch.ones(4, 81, dtype=torch.long), "puzzle_identifiers": torch.zeros(4, dtype=torch.long)}
    carry = tiny_model.initial_carry(batch)
    carry, out = tiny_model(carry, batch)
    assert "target_q_continue" in out and out["target_q_continue"].shape == (4,)
    assert torch.all(carry.steps == 1)
