"""verify on the trained tiny fixture: FP32 ONNX passes; an INT8 graph with broken scales is caught."""

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from typer.testing import CliRunner

from hrm_deploy.artifacts import find_reference
from hrm_deploy.cli import app
from hrm_deploy.manifest import read_manifest
from hrm_deploy.precision.calibrate import QuantConfig
from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph
from hrm_deploy.verify import verify

runner = CliRunner()


def test_verify_fp32_onnx_passes_and_is_recorded(tiny_onnx):
    report = verify(tiny_onnx.unrolled, tiny_onnx.data, samples=100)
    assert report["passed"], report["failures"]
    assert report["logits"]["argmax_agreement"] == 1.0 and report["candidate"]["exact_accuracy"] >= 0.9
    assert report["reference_checkpoint"].endswith("sudoku-tiny.pt")  # found through the manifest
    assert read_manifest(tiny_onnx.unrolled)["verify"]["passed"]
    md = tiny_onnx.unrolled.with_name(tiny_onnx.unrolled.name + ".verify.md").read_text()
    assert "PASSED" in md


@pytest.mark.slow
def test_verify_catches_broken_int8_scales(tiny_onnx, tmp_path):
    cfg = PrecisionConfig(
        "int8",
        calib_data=tiny_onnx.data,
        quant=QuantConfig(method="minmax", samples=64),
        cache_dir=str(tmp_path / "calib"),
    )
    good = make_precision_graph(tiny_onnx.unrolled, cfg, out=tmp_path / "good.int8.onnx", quiet=True)
    model = onnx.load(str(good.path))
    scales = {n.input[1] for n in model.graph.node if n.op_type == "QuantizeLinear"}  # activation scales
    for init in model.graph.initializer:
        if init.name in scales:
            scale = numpy_helper.to_array(init)
            init.CopyFrom(
                numpy_helper.from_array(np.asarray(scale * 40.0, dtype=scale.dtype).reshape(scale.shape), init.name)
            )
    broken = tmp_path / "broken.int8.onnx"
    onnx.save(model, broken)
    result = runner.invoke(
        app,
        [
            "verify",
            str(broken),
            "--data",
            tiny_onnx.data,
            "--samples",
            "100",
            "--against",
            str(find_reference(tiny_onnx.unrolled)),
        ],
    )
    assert result.exit_code == 3, result.output
    assert "FAILED" in result.output
    report = json.loads((tmp_path / "broken.int8.onnx.verify.json").read_text())
    assert report["precision"] == "int8" and not report["passed"] and report["flipped"]["lost"]


def test_verify_step_graph_reports_the_per_step_curve(tiny_onnx):
    report = verify(tiny_onnx.step, tiny_onnx.data, samples=50)
    assert report["passed"] and report["per_step_disagreement"] == [0.0] * report["steps"]
    assert len(report["per_step_exact_candidate"]) == report["steps"]
    assert report["per_step_exact_candidate"][-1] == report["candidate"]["exact_accuracy"]


def _copy(tiny_onnx, folder):
    """The tiny unrolled graph and its manifest copied into ``folder`` as copy.onnx."""
    import shutil

    copy = folder / "copy.onnx"
    shutil.copy(tiny_onnx.unrolled, copy)
    shutil.copy(
        tiny_onnx.unrolled.with_name(tiny_onnx.unrolled.name + ".manifest.json"), folder / "copy.onnx.manifest.json"
    )
    return copy


def test_verify_refuses_a_reference_that_changed(tiny_onnx, tmp_path):
    import shutil

    import pytest

    from hrm_deploy.errors import ArtifactError
    from hrm_deploy.manifest import update_manifest

    copy = _copy(tiny_onnx, tmp_path)
    ckpt = tmp_path / "ckpt.pt"
    shutil.copy(find_reference(tiny_onnx.unrolled), ckpt)
    update_manifest(copy, parent={"path": str(ckpt), "sha256": "0" * 64})
    with pytest.raises(ArtifactError, match="changed since"):
        verify(copy, tiny_onnx.data, samples=8)


def test_verify_against_another_checkpoint_is_one_line_and_keeps_the_report(tiny_onnx, tmp_path):
    import pytest
    import torch

    from hrm_deploy.errors import ArtifactError

    copy = _copy(tiny_onnx, tmp_path)
    report = tmp_path / "copy.onnx.verify.json"
    report.write_text('{"passed": true}')
    other = tmp_path / "other.pt"
    state = torch.load(find_reference(tiny_onnx.unrolled), map_location="cpu", weights_only=True)
    torch.save(state, other)  # the same weights re-saved: other bytes, so not the recorded checkpoint
    with pytest.raises(ArtifactError, match="is not the checkpoint copy.onnx was made from"):
        verify(copy, tiny_onnx.data, against=other, samples=8)
    assert report.read_text() == '{"passed": true}'
