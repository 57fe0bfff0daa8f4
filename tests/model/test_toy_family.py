"""Adding a model family is its own modules (config class with its helpers, network) plus one row
of plain data in the family table (docs/families.md). A toy family written from scratch
(tests/model/toy_family.py: an MLP-only recursion, neither HRM nor TRM) registered that way is
written and read in upstream's layout by the toolkit's writer and loader, which name no family,
and goes through export, the cpu target's static INT8 and verify."""

from __future__ import annotations

import pytest
import torch
import yaml

from hrm_deploy.model import families
from hrm_deploy.model.checkpoint import load_checkpoint, read_checkpoint
from tests.model.toy_family import ROW, ToyConfig

SIZE = dict(seq_len=81, vocab_size=11, hidden_size=64, num_heads=4, halt_max_steps=2, expansion=2.0)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(families.FAMILIES, "toy", ROW)
    return ROW


def _toy_model(seed: int = 0):
    from tests.model.toy_family_net import ToyACT

    torch.manual_seed(seed)
    model = ToyACT(ToyConfig(**SIZE)).eval()
    with torch.no_grad():  # decisive answers: the logits follow each cell's token (quantization keeps them)
        model.inner.lm_head.weight.copy_(model.inner.embed_tokens.embedding_weight * 8.0)
    return model


def test_the_toy_row_is_plain_data_and_its_class_holds_the_helpers(toy):
    assert families.family_named("toy").config_class is ToyConfig
    keys = ["toy_level.0.mlp.gate_up_proj.weight", "embed_tokens.embedding_weight"]
    assert families.detect_family(keys, None, "run").name == "toy"
    assert families.detect_family(keys, "toy.mlp@ToyACT", "run").name == "toy"
    config = ToyConfig(**SIZE)
    assert families.config_from_dict(config.to_dict()) == config  # a stored config finds its family
    assert families.describe(config)["family"] == "toy"


def test_an_upstream_run_of_the_toy_family_is_written_under_its_data_key_and_read_back(toy, tmp_path, monkeypatch):
    from hrm_deploy.model.upstream_writer import write_upstream_run
    from tests.conftest import write_dataset_json

    monkeypatch.chdir(tmp_path)
    model = _toy_model()
    write_dataset_json(tmp_path / "data" / "toy", model.inner.config)
    step = write_upstream_run(tmp_path / "run", model, step=7, data_path="data/toy")
    written = yaml.safe_load((tmp_path / "run" / "all_config.yaml").read_text())
    assert written["toy_data"] == "data/toy" and "data_path" not in written  # the row's data_key
    assert written["arch"]["name"] == "toy.mlp@ToyACT"

    contents = read_checkpoint(step)
    assert type(contents.config) is ToyConfig and contents.config.L_layers == 2  # L_layers from its weights
    loaded, config = load_checkpoint(step)
    assert type(loaded).__name__ == "ToyACT" and config == model.inner.config
    for key, value in model.inner.state_dict().items():
        if key not in ("H_init", "L_init"):  # upstream stores those in bf16
            assert torch.equal(loaded.inner.state_dict()[key], value), key


@pytest.mark.slow
def test_the_toy_family_goes_through_export_cpu_int8_and_verify(toy, tmp_path):
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.manifest import read_manifest
    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.verify import verify

    data = tmp_path / "sudoku"
    generate_sudoku(SudokuSpec(train=32, test=64, blanks=(10, 20), seed=3, workers=1), str(data))
    checkpoint = save_checkpoint(tmp_path / "toy.pt", _toy_model())
    fp32 = export_onnx(checkpoint, tmp_path / "toy.onnx", ExportConfig(), quiet=True)  # parity checked
    assert read_manifest(fp32.path)["mode"] == "step"  # the row's default mode
    config = EngineConfig("int8", target="cpu", calib_data=str(data), calib_samples=32)
    engine = build_engine(fp32.path, config, tmp_path / "toy.int8.cpu.ort.onnx", quiet=True)
    recipe = read_manifest(engine.path)["recipe"]
    assert recipe["accuracy"]["checked"] and recipe["accuracy"]["measured"]["holdout_puzzles"] == 64
    assert engine.build["quantized_nodes"] > 0
    report = verify(engine.path, data, samples=64, quiet=True)
    assert report["passed"], report["failures"]
