"""The docs' walk-through, offline on CPU: data arc -> train (arc-tiny) -> export -> arc-eval."""

from __future__ import annotations

import json

import pytest

from tests.arc.test_data import make_tasks


@pytest.mark.slow
def test_data_train_export_arc_eval(tmp_path):
    from hrm_deploy.arc.evaluate import ArcEvalConfig, arc_eval
    from hrm_deploy.data.arc import ArcSpec, build_arc
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.train.loop import train
    from hrm_deploy.train.presets import train_configs

    data = tmp_path / "arc"
    build_arc(ArcSpec(str(make_tasks(tmp_path / "src")), num_aug=4, max_grid=10), data)
    model_config, config = train_configs(
        "arc-tiny", data, tmp_path / "run", overrides={"steps": 4, "eval_every": 4, "global_batch_size": 4}
    )
    assert model_config.seq_len == 100 and model_config.vocab_size == 12
    result = train(model_config, config, progress=False)
    onnx = export_onnx(result.checkpoint, tmp_path / "arc.onnx", ExportConfig(parity=False), quiet=True).path
    settings = ArcEvalConfig(quiet=True)
    ref = arc_eval(result.checkpoint, data, tmp_path / "ckpt.json", config=settings)
    got = arc_eval(onnx, data, tmp_path / "onnx.json", against=result.checkpoint, config=settings)
    assert got["pass_at"] == ref["pass_at"] and got["passed"] is True
    assert json.loads((tmp_path / "onnx.json").read_text()).keys() == {"ev000000", "ev000001"}
