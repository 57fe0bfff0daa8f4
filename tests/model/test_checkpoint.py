import pickle

import pytest
import torch
import yaml

from hrm_deploy.errors import CheckpointError, ConfigError
from hrm_deploy.model.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint, upstream_state_dict
from tests.conftest import write_upstream_run


def _same_weights(a, b):
    sa, sb = a.inner.state_dict(), b.inner.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k].float(), sb[k].float()) for k in sa)


@pytest.mark.parametrize("prefix", ["_orig_mod.model.inner.", "model.inner.", "inner."])
def test_upstream_prefixes_round_trip(tmp_path, tiny_model, monkeypatch, prefix):
    monkeypatch.chdir(tmp_path)
    ckpt = write_upstream_run(tmp_path, tiny_model, prefix=prefix)
    model, cfg = load_checkpoint(ckpt)
    assert cfg.seq_len == 81 and cfg.num_heads == 4 and cfg.halt_max_steps == 4
    assert cfg.forward_dtype == "float32"
    assert _same_weights(model, tiny_model)
    info = read_checkpoint(ckpt)
    assert info.kind == "upstream" and info.prefix == prefix and info.step == 100


def test_upstream_init_buffers_are_bf16_and_load_exactly(upstream_run, tiny_model):
    raw = torch.load(upstream_run, weights_only=True)
    assert raw["_orig_mod.model.inner.H_init"].dtype == torch.bfloat16
    model, _ = load_checkpoint(upstream_run)
    assert torch.equal(model.inner.H_init, raw["_orig_mod.model.inner.H_init"].float())


def test_run_folder_picks_highest_step(upstream_run, tiny_model):
    torch.save(upstream_state_dict(tiny_model), upstream_run.parent / "step_7")
    assert read_checkpoint(upstream_run.parent).path.name == "step_100"


def test_dataset_fields_from_options_when_no_dataset(tmp_path, tiny_model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = write_upstream_run(tmp_path, tiny_model, with_dataset=False)
    with pytest.raises(ConfigError, match="--seq-len"):
        load_checkpoint(ckpt)
    _, cfg = load_checkpoint(ckpt, seq_len=81)
    assert cfg.vocab_size == 11 and cfg.num_puzzle_identifiers == 1  # inferred from weights


def test_data_path_option_finds_dataset(tmp_path, tiny_model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = write_upstream_run(tmp_path, tiny_model, with_dataset=False)
    write_upstream_run(tmp_path / "elsewhere", tiny_model)
    _, cfg = load_checkpoint(ckpt, data_path=str(tmp_path / "elsewhere" / "data" / "sudoku-tiny"))
    assert cfg.seq_len == 81


def test_missing_config_needs_arch_options(tmp_path, tiny_model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = write_upstream_run(tmp_path, tiny_model, with_config=False)
    with pytest.raises(ConfigError, match="num-heads"):
        load_checkpoint(ckpt, seq_len=81)
    _, cfg = load_checkpoint(ckpt, seq_len=81, num_heads=4, H_cycles=2, L_cycles=2, halt_max_steps=4)
    assert cfg.hidden_size == 64 and cfg.H_layers == 2 and cfg.puzzle_emb_ndim == 64


def test_our_checkpoint_round_trip(tmp_path, tiny_model):
    path = save_checkpoint(tmp_path / "ours.pt", tiny_model, step=42, train_config={"lr": 1e-3})
    model, cfg = load_checkpoint(path)
    assert cfg == tiny_model.config and _same_weights(model, tiny_model)
    contents = read_checkpoint(path)
    assert contents.kind == "hrm-deploy" and contents.step == 42 and contents.train_config == {"lr": 1e-3}
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("H_layers", 3, "arch.H_layers .* is 3 but the weights have H_layers=2"),
        ("expansion", 8, "expansion"),
        ("hidden_size", 128, "arch.hidden_size .* is 128 but the weights"),
        ("pos_encodings", "learned", "arch.pos_encodings .* the weights"),
    ],
)
def test_wrong_config_is_one_line_naming_keys(upstream_run, field, value, expected):
    cfg_file = upstream_run.parent / "all_config.yaml"
    data = yaml.safe_load(cfg_file.read_text())
    data["arch"][field] = value
    cfg_file.write_text(yaml.dump(data))
    with pytest.raises(CheckpointError, match=expected) as err:
        load_checkpoint(upstream_run)
    assert "\n" not in str(err.value)


def test_missing_and_misshaped_keys(tmp_path, tiny_model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt = write_upstream_run(tmp_path, tiny_model)
    state = torch.load(ckpt, weights_only=True)
    del state["_orig_mod.model.inner.q_head.bias"]
    state["_orig_mod.model.inner.lm_head.weight"] = torch.zeros(12, 64)
    torch.save(state, ckpt)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(ckpt, vocab_size=11)
    msg = str(err.value)
    assert "q_head.bias" in msg and "lm_head.weight" in msg and "\n" not in msg


def test_truncated_file(upstream_run):
    data = upstream_run.read_bytes()
    upstream_run.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(upstream_run)


def test_not_a_checkpoint(tmp_path):
    (tmp_path / "step_1").write_text("hello")
    with pytest.raises(CheckpointError, match="not a PyTorch checkpoint"):
        load_checkpoint(tmp_path / "step_1")
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty"):
        load_checkpoint(tmp_path / "empty.pt")


def test_unsafe_pickle_is_refused(tmp_path):
    import argparse

    path = tmp_path / "evil.pt"
    torch.save({"x": argparse.Namespace(a=1)}, path, pickle_module=pickle)
    with pytest.raises(CheckpointError, match="weights_only"):
        load_checkpoint(path)


def test_foreign_state_dict(tmp_path):
    torch.save({"encoder.weight": torch.zeros(2, 2)}, tmp_path / "bert.bin")
    with pytest.raises(CheckpointError, match="not an HRM checkpoint"):
        load_checkpoint(tmp_path / "bert.bin")


def test_trm_like_checkpoint_is_named(tmp_path):
    torch.save(
        {"model.inner.L_level.layers.0.mlp.down_proj.weight": torch.zeros(2, 2), "model.inner.H_init": torch.zeros(2)},
        tmp_path / "step_5",
    )
    with pytest.raises(ConfigError, match=r"Tiny Recursive Model.*all_config.yaml \(absent\)"):
        load_checkpoint(tmp_path / "step_5")


def test_a_checkpoint_trained_in_bfloat16_loads_and_exports_in_float32(tmp_path):
    """The Sudoku-size preset trains in bfloat16 (upstream's setting) and records it in its config:
    `export run/last.pt` must work as written, computing in float32 (precision is chosen per target),
    while the checkpoint itself still says how it was trained (a resume keeps bfloat16)."""
    import torch

    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.model.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.model.hrm import build_model
    from tests.conftest import TINY

    ckpt = save_checkpoint(
        tmp_path / "last.pt", build_model(HRMConfig(**{**TINY, "forward_dtype": "bfloat16"}), seed=0)
    )
    assert read_checkpoint(ckpt).config.forward_dtype == "bfloat16"
    model, config = load_checkpoint(ckpt)
    assert config.forward_dtype == "float32" and model.inner.compute_dtype == torch.float32
    assert load_checkpoint(ckpt, forward_dtype="bfloat16")[0].inner.compute_dtype == torch.bfloat16
    result = export_onnx(ckpt, tmp_path / "m.onnx", ExportConfig(mode="step", max_batch=2), quiet=True)
    assert result.parity is not None and (tmp_path / "m.onnx").is_file()
