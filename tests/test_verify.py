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


def _poisoned(source, out, rows_where: int, precision: str = "int8"):
    """A copy of the graph ``source`` whose q_halt is NaN on the rows whose first cell holds token
    ``rows_where`` (an engine bug a user could meet), labelled ``precision`` and resealed as
    hrm-deploy would: only the judge can tell."""
    import onnx
    from onnx import TensorProto, helper

    from hrm_deploy.io import sha256_file
    from hrm_deploy.manifest import manifest_path, manifest_text

    model = onnx.load(str(source))
    graph = model.graph
    producer = next(n for n in graph.node if "q_halt_logits" in n.output)
    producer.output[list(producer.output).index("q_halt_logits")] = "q_halt_clean"
    graph.initializer.extend(
        [
            helper.make_tensor("poison_token", TensorProto.INT32, [], [rows_where]),
            helper.make_tensor("poison_nan", TensorProto.FLOAT, [], [float("nan")]),
            helper.make_tensor("poison_first", TensorProto.INT64, [1], [0]),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Gather", ["inputs", "poison_first"], ["poison_cell"], axis=1),  # [B, 1]
            helper.make_node("Cast", ["poison_cell"], ["poison_cell32"], to=TensorProto.INT32),
            helper.make_node("Equal", ["poison_cell32", "poison_token"], ["poison_rows"]),
            helper.make_node("Where", ["poison_rows", "poison_nan", "q_halt_clean"], ["q_halt_logits"]),
        ]
    )
    for prop in model.metadata_props:
        if prop.key == "hrm_deploy.precision":
            prop.value = precision
    onnx.save(model, str(out))
    data = read_manifest(source)
    data.update(artifact=out.name, sha256=sha256_file(out), size_bytes=out.stat().st_size, precision=precision)
    parent = dict(data["parent"])
    parent["path"] = str(find_reference(source))  # the copy's own relative path to its checkpoint
    data["parent"] = parent
    manifest_path(out).write_text(manifest_text(data))
    return out


def test_verify_fails_a_graph_whose_q_halt_is_nan_on_a_few_rows(tiny_onnx, tmp_path):
    """NaN where an engine should answer once PASSED (NaN compares false with every threshold); now the
    command fails and says which output, how many values and where."""
    from hrm_deploy.data.examples import load_examples

    examples = load_examples(tiny_onnx.data, 100, split="test")
    token = int(np.bincount(examples.inputs[:, 0]).argmax())  # the most common first cell
    poisoned = _poisoned(tiny_onnx.unrolled, tmp_path / "nanq.onnx", token)
    result = runner.invoke(app, ["verify", str(poisoned), "--data", tiny_onnx.data, "--samples", "100"])
    assert result.exit_code == 3, result.output
    rows = int((examples.inputs[:, 0] == token).sum())
    assert f"the candidate's q_halt_logits hold {rows} non-finite values" in result.output
    report = json.loads((tmp_path / "nanq.onnx.verify.json").read_text())
    assert report["precision"] == "int8" and not report["passed"] and report["nonfinite"][0]["count"] == rows
