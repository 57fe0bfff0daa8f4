"""TRM as a model family: upstream-layout checkpoints load strictly, and the forward equals
upstream's own code (tests/model/trm_oracle.py, copied from TinyRecursiveModels)."""

from __future__ import annotations

import pytest
import torch
import yaml

from hrm_deploy.errors import CheckpointError, ConfigError
from hrm_deploy.model.checkpoint import load_checkpoint, read_checkpoint
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.families import config_from_dict, describe, detect_family
from hrm_deploy.model.trm_config import TRMConfig
from tests.conftest import TRM_TINY, TRM_VARIANTS, make_trm, write_trm_upstream_run
from tests.model.trm_oracle import build_oracle, upstream_eval


def _oracle_for(step_path, dtype: str = "float32"):
    run_cfg = yaml.safe_load((step_path.parent / "all_config.yaml").read_text())
    state = torch.load(step_path, weights_only=True)
    state = {k.removeprefix("_orig_mod.model.inner."): v for k, v in state.items()}
    dataset = {k: TRM_TINY[k] for k in ("seq_len", "vocab_size", "num_puzzle_identifiers")}
    return build_oracle(run_cfg["arch"], dataset, state, dtype)


@pytest.mark.parametrize("batch", [1, 3])
def test_forward_equals_upstream_code(trm_run, batch):
    from hrm_deploy.export.unroll import unroll, upstream_evaluate

    step_path, _ = trm_run
    model, cfg = load_checkpoint(step_path)
    oracle = _oracle_for(step_path)
    gen = torch.Generator().manual_seed(batch)
    inputs = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=gen, dtype=torch.int32)
    pids = torch.randint(0, cfg.num_puzzle_identifiers, (batch,), generator=gen, dtype=torch.int32)
    ref_logits, ref_halt, ref_cont = upstream_eval(oracle, inputs, pids, cfg.halt_max_steps)
    ours = upstream_evaluate(model, inputs, pids)
    torch.testing.assert_close(ours["logits"], ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours["q_halt_logits"], ref_halt, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours["q_continue_logits"], ref_cont, rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        logits, q_halt, _ = unroll(model)(inputs, pids)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q_halt, ref_halt, rtol=1e-5, atol=1e-5)


def test_prefix_is_puzzle_emb_len_not_ceil():
    cfg = TRMConfig(**TRM_TINY, **TRM_VARIANTS["attention"])
    assert cfg.puzzle_emb_len == 4 and cfg.total_seq_len == 85
    assert HRMConfig(**{k: v for k, v in TRM_TINY.items() if k != "puzzle_emb_len"}).puzzle_emb_len == 1
    assert TRMConfig(**{**TRM_TINY, "puzzle_emb_len": 0}).puzzle_emb_len == 1  # upstream: 0 means ceil
    assert cfg.blocks_per_step == 2 * (3 + 1) * 2


def test_config_round_trips_through_the_family_key():
    cfg = TRMConfig(**TRM_TINY, **TRM_VARIANTS["mlp_t"])
    data = cfg.to_dict()
    assert data["family"] == "trm"
    assert config_from_dict(data) == cfg  # any reader of a stored config gets the right family
    assert "family" not in HRMConfig(seq_len=4, vocab_size=5).to_dict()
    with pytest.raises(ConfigError, match="family 'xyz' is unknown"):
        config_from_dict({**data, "family": "xyz"})
    with pytest.raises(ConfigError, match="config_from_dict"):  # a config class builds only its own family
        HRMConfig.from_dict(data)


@pytest.mark.parametrize("prefix", ["_orig_mod.model.inner.", "model.inner."])
def test_both_key_styles_and_bf16_init(tmp_path, monkeypatch, prefix):
    monkeypatch.chdir(tmp_path)
    model = make_trm("mlp_t")
    path = write_trm_upstream_run(tmp_path, model, prefix=prefix)
    assert torch.load(path, weights_only=True)[prefix + "H_init"].dtype == torch.bfloat16
    contents = read_checkpoint(path)
    assert contents.prefix == prefix and contents.config.family == "trm"
    loaded, _ = load_checkpoint(path)
    for k, v in model.inner.state_dict().items():
        assert torch.equal(loaded.inner.state_dict()[k], v), k


def test_describe_shows_recursion(trm_run):
    _, model = trm_run
    info = describe(model.inner.config)
    assert info["family"] == "trm" and info["H_cycles"] == 2 and info["L_cycles"] == 3 and info["L_layers"] == 2
    assert info["mixer"] == ("mlp-t" if model.inner.config.mlp_t else "attention")
    assert "8 passes per ACT step" in info["recursion"]


@pytest.mark.parametrize(
    "drop, match",
    [
        ("H_cycles", "lacks arch.H_cycles"),
        ("halt_max_steps", "lacks arch.halt_max_steps"),
        ("puzzle_emb_len", "lacks arch.puzzle_emb_len"),
        ("pos_encodings", "lacks arch.pos_encodings"),
        ("no_ACT_continue", "lacks arch.no_ACT_continue"),
    ],
)
def test_missing_fields_are_one_clear_error(tmp_path, monkeypatch, drop, match):
    monkeypatch.chdir(tmp_path)
    path = write_trm_upstream_run(tmp_path, make_trm("attention"), drop_arch=(drop,))
    with pytest.raises(ConfigError, match=match):
        read_checkpoint(path)


def test_mlp_t_prefix_comes_from_the_weights(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_trm_upstream_run(tmp_path, make_trm("mlp_t"), drop_arch=("puzzle_emb_len",))
    assert read_checkpoint(path).config.puzzle_emb_len == 4


@pytest.mark.parametrize(
    "variant, override, match",
    [
        ("attention", {"mlp_t": True}, "arch.mlp_t in all_config.yaml is True but the weights have mlp_t=False"),
        ("mlp_t", {"puzzle_emb_len": 16}, "span 85 positions"),
        ("attention", {"hidden_size": 128}, "hidden_size"),
        ("attention", {"expansion": 8.0}, "arch.expansion"),
        ("attention", {"name": "hrm.hrm_act_v1@HierarchicalReasoningModel_ACTV1"}, "laid out as Tiny Recursive"),
        ("attention", {"name": "mine@Other"}, "no family claims"),
    ],
)
def test_contradictions_are_one_clear_error(tmp_path, monkeypatch, variant, override, match):
    monkeypatch.chdir(tmp_path)
    path = write_trm_upstream_run(tmp_path, make_trm(variant), arch_overrides=override)
    with pytest.raises((CheckpointError, ConfigError), match=match):
        load_checkpoint(path)


def test_data_paths_list_and_missing_dataset(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_trm_upstream_run(tmp_path, make_trm("attention"), with_dataset=False)
    with pytest.raises(ConfigError, match="all_config.yaml's data_paths"):
        read_checkpoint(path)
    assert read_checkpoint(path, seq_len=81, vocab_size=11).config.seq_len == 81


def test_hrm_layout_detected_and_refused_keys():
    assert detect_family(["H_level.layers.0.x", "L_level.layers.0.x"], None, "f").name == "hrm"
    assert detect_family(["L_level.layers.0.x"], None, "f").name == "trm"
    with pytest.raises(CheckpointError, match="match no known model family"):
        detect_family(["foo.weight"], None, "f")


def test_training_halts_on_q_halt_alone():
    model = make_trm("attention").train()
    cfg = model.config.replace(halt_exploration_prob=0.0)
    model.config = cfg
    batch = {
        "inputs": torch.zeros(4, 81, dtype=torch.int32),
        "puzzle_identifiers": torch.zeros(4, dtype=torch.int32),
        "labels": torch.zeros(4, 81, dtype=torch.int32),
    }
    with torch.no_grad():
        model.inner.q_head.weight.zero_()
        model.inner.q_head.bias.copy_(torch.tensor([0.5, 9.0]))  # q_halt > 0, q_continue larger
    carry, outputs = model(model.initial_carry(batch), batch)
    assert bool(carry.halted.all())  # HRM's rule (q_halt > q_continue) would continue
    assert "target_q_continue" not in outputs
