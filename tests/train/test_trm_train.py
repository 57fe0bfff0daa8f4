"""Training a TRM in the bundled trainer: upstream's gradients (only the last of the T cycles),
EMA weights in checkpoints, exact resume, and ``--export-upstream`` in TRM's own layout."""

from __future__ import annotations

import pytest
import torch
import yaml

from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
from hrm_deploy.model.checkpoint import load_checkpoint, read_checkpoint
from hrm_deploy.model.trm_config import TRMConfig
from hrm_deploy.train.loop import TrainConfig, train

MICRO_TRM = TRMConfig(
    seq_len=81,
    vocab_size=11,
    hidden_size=32,
    num_heads=2,
    L_layers=1,
    H_cycles=2,
    L_cycles=1,
    halt_max_steps=2,
    puzzle_emb_ndim=32,
    puzzle_emb_len=2,
    mlp_t=True,
    pos_encodings="none",
)


@pytest.fixture(scope="module")
def micro_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "sudoku"
    generate_sudoku(SudokuSpec(train=40, test=8, blanks=(4, 8), seed=0, workers=1), str(root))
    return str(root)


def _cfg(data, out, **kw):
    settings = dict(steps=4, global_batch_size=8, lr=1e-3, lr_warmup_steps=1, eval_samples=8)
    return TrainConfig(data_path=data, out_dir=str(out), **{**settings, **kw})


def test_gradients_equal_upstream_code():
    """Loss gradients of our training forward equal those of upstream's own forward (the oracle
    runs the first T-1 cycles under no_grad and the last with gradient, as ours must)."""
    from types import SimpleNamespace

    from hrm_deploy.model.hrm import build_model
    from tests.model.trm_oracle import build_oracle

    cfg = MICRO_TRM.replace(pos_encodings="rope", mlp_t=False)
    for config in (MICRO_TRM, cfg):
        model = build_model(config, seed=3).train()
        arch = {
            k: getattr(config, k)
            for k in (
                "H_cycles",
                "L_cycles",
                "L_layers",
                "hidden_size",
                "num_heads",
                "expansion",
                "puzzle_emb_ndim",
                "puzzle_emb_len",
                "mlp_t",
                "pos_encodings",
                "rms_norm_eps",
                "rope_theta",
            )
        }
        oracle = build_oracle(
            arch,
            {"seq_len": 81, "vocab_size": 11, "num_puzzle_identifiers": 1},
            {k: v.clone() for k, v in model.inner.state_dict().items()},
        ).train()
        inputs = torch.randint(0, 11, (3, 81), generator=torch.Generator().manual_seed(0))
        pids = torch.zeros(3, dtype=torch.int32)
        carry = model.inner.initial_state(3)
        _, logits, (q_halt, _) = model.inner(carry, inputs, pids)
        (logits.square().mean() + q_halt.sum()).backward()
        start = SimpleNamespace(z_H=carry.z_H.clone(), z_L=carry.z_L.clone())
        _, ref_logits, (ref_q_halt, _) = oracle(start, {"inputs": inputs, "puzzle_identifiers": pids})
        (ref_logits.square().mean() + ref_q_halt.sum()).backward()
        ref_grads = dict(oracle.named_parameters())
        for name, param in model.inner.named_parameters():
            torch.testing.assert_close(param.grad, ref_grads[name].grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_ema_checkpoint_and_exact_resume(micro_data, tmp_path):
    from hrm_deploy.model.hrm import build_model

    rate = 0.9
    # step 1 runs at lr 0 (warmup), step 2 moves the weights: shadow = (1 - r) p2 + r p0
    one = train(MICRO_TRM, _cfg(micro_data, tmp_path / "one", steps=2, ema=True, ema_rate=rate), progress=False)
    contents = read_checkpoint(one.checkpoint)
    live, init = contents.extra["live_state"], build_model(MICRO_TRM, seed=0).inner.state_dict()
    name = "L_level.layers.0.mlp_t.gate_up_proj.weight"
    assert not torch.equal(live[name], init[name])  # the step moved the live weights
    torch.testing.assert_close(contents.state_dict[name], (1 - rate) * live[name] + rate * init[name])

    full = train(MICRO_TRM, _cfg(micro_data, tmp_path / "full", ema=True, ema_rate=rate), progress=False)
    part = train(MICRO_TRM, _cfg(micro_data, tmp_path / "part", ema=True, ema_rate=rate), stop_after=2, progress=False)
    resumed = train(
        MICRO_TRM,
        _cfg(micro_data, tmp_path / "part", ema=True, ema_rate=rate),
        resume=str(part.checkpoint),
        progress=False,
    )
    a, b = read_checkpoint(full.checkpoint), read_checkpoint(resumed.checkpoint)
    for key, value in a.state_dict.items():
        assert torch.equal(value, b.state_dict[key]), key
        assert torch.equal(a.extra["live_state"][key], b.extra["live_state"][key]), key


@pytest.mark.slow
def test_export_upstream_writes_trm_layout(micro_data, tmp_path, monkeypatch):
    from tests.model.trm_oracle import build_oracle, upstream_eval

    result = train(MICRO_TRM, _cfg(micro_data, tmp_path / "run", export_upstream=True, ema=True), progress=False)
    upstream = tmp_path / "run" / "upstream"
    all_config = yaml.safe_load((upstream / "all_config.yaml").read_text())
    assert all_config["arch"]["name"] == "recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1"
    assert all_config["data_paths"] == [micro_data] and "data_path" not in all_config
    assert all_config["arch"]["mlp_t"] is True and all_config["arch"]["puzzle_emb_len"] == 2
    state = torch.load(upstream / "step_4", weights_only=True)
    assert all(k.startswith("_orig_mod.model.inner.L_level.") or "L_level" not in k for k in state)
    assert state["_orig_mod.model.inner.H_init"].dtype == torch.bfloat16
    ours, ours_cfg = load_checkpoint(result.checkpoint)  # the EMA weights
    theirs, theirs_cfg = load_checkpoint(upstream / "step_4")
    assert theirs_cfg == ours_cfg
    for (k, va), vb in zip(ours.state_dict().items(), theirs.state_dict().values()):
        torch.testing.assert_close(va, vb, msg=k)
    oracle = build_oracle(
        all_config["arch"],
        {"seq_len": 81, "vocab_size": 11, "num_puzzle_identifiers": 1},
        {k.removeprefix("_orig_mod.model.inner."): v for k, v in state.items()},
    )
    inputs, pids = torch.randint(0, 11, (2, 81)), torch.zeros(2, dtype=torch.int32)
    from hrm_deploy.export.unroll import upstream_evaluate

    torch.testing.assert_close(
        upstream_evaluate(ours, inputs, pids)["logits"], upstream_eval(oracle, inputs, pids, 2)[0]
    )


def test_trm_preset_builds_a_trm_config(micro_data, tmp_path):
    from hrm_deploy.train.presets import train_configs

    model_config, config = train_configs("trm-sudoku-small", micro_data, tmp_path / "run")
    assert isinstance(model_config, TRMConfig) and model_config.mlp_t and config.ema


# Measured on 500 held-out puzzles by scripts/refresh_bundled_checkpoint.py --preset trm-sudoku-small
# (benchmarks/results/trm_sudoku_small_preset.json); the bound sits under it for 100 fresh puzzles.
TRM_SMALL_MIN_EXACT = 0.85


@pytest.mark.slow
def test_bundled_trm_is_trained(tmp_path):
    """The shipped trm-sudoku-small (mlp_t TRM) solves held-out puzzles it never saw."""
    from hrm_deploy.data.format import load_split
    from hrm_deploy.train.act_eval import act_report, step_outcomes
    from hrm_deploy.train.presets import bundled_checkpoint, preset

    model, config = load_checkpoint(bundled_checkpoint("trm-sudoku-small"))
    assert isinstance(config, TRMConfig) and config.mlp_t and config.pos_encodings == "none"
    spec = preset("trm-sudoku-small")["data"]
    generate_sudoku(SudokuSpec(**{**spec, "train": 10, "test": 100, "seed": 777, "workers": 1}), str(tmp_path / "d"))
    report = act_report(step_outcomes(model, load_split(tmp_path / "d", "test")))
    assert report["count"] == 100 and report["per_step_exact_accuracy"][-1] >= TRM_SMALL_MIN_EXACT, report


@pytest.mark.slow
def test_export_cli_takes_a_bundled_model(tmp_path):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app
    from hrm_deploy.manifest import read_manifest

    out = tmp_path / "trm.onnx"
    result = CliRunner().invoke(app, ["export", "--model", "trm-sudoku-small", "-o", str(out), "-q"])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(out)
    assert manifest["mode"] == "step" and manifest["unroll"]["family"] == "trm"
    both = CliRunner().invoke(app, ["export", str(out), "--model", "trm-sudoku-small", "-q"])
    assert both.exit_code == 2 and "not both" in both.output
