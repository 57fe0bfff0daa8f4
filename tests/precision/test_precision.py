"""FP16/BF16/INT8 graphs of the trained tiny model, checked on ONNX Runtime CPU."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from hrm_deploy.data.examples import load_examples
from hrm_deploy.errors import ConfigError, DataError
from hrm_deploy.precision.accuracy import onnx_accuracy
from hrm_deploy.precision.calibrate import QuantConfig
from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph
from tests.conftest import mlp_weights


def _accuracy(path, examples):
    return onnx_accuracy(str(path), examples)


@pytest.fixture(scope="module")
def heldout(tiny_onnx):
    return load_examples(tiny_onnx.data, None, split="test")


def test_fp16_keeps_norms_in_float32_and_the_answers(tiny_onnx, heldout, tmp_path):
    result = make_precision_graph(tiny_onnx.unrolled, PrecisionConfig("fp16"), out=tmp_path / "m.fp16.onnx", quiet=True)
    model = onnx.load(str(result.path))
    assert any(i.data_type == TensorProto.FLOAT16 for i in model.graph.initializer)
    assert [o.type.tensor_type.elem_type for o in model.graph.output] == [TensorProto.FLOAT] * 3  # I/O types kept
    onnx.checker.check_model(model)
    types = {v.name: v.type.tensor_type.elem_type for v in model.graph.value_info}
    means = [n for n in model.graph.node if n.op_type == "ReduceMean"]
    assert means and all(types.get(n.output[0]) == TensorProto.FLOAT for n in means)  # float32 islands
    fp32, fp16 = _accuracy(tiny_onnx.unrolled, heldout), _accuracy(result.path, heldout)
    assert fp32["exact_accuracy"] >= 0.9 and abs(fp32["exact_accuracy"] - fp16["exact_accuracy"]) <= 0.01
    assert json.loads(result.manifest.read_text())["parent"]["sha256"]


def test_bf16_is_a_valid_bfloat16_graph(tiny_onnx, tmp_path):
    result = make_precision_graph(tiny_onnx.unrolled, PrecisionConfig("bf16"), out=tmp_path / "m.bf16.onnx", quiet=True)
    model = onnx.load(str(result.path))
    onnx.checker.check_model(model)
    kinds = {i.data_type for i in model.graph.initializer}
    assert TensorProto.BFLOAT16 in kinds and TensorProto.FLOAT16 not in kinds


@pytest.mark.slow
def test_int8_qdq_follows_tensorrt_convention_and_keeps_accuracy(tiny_onnx, heldout, tmp_path):
    cfg = PrecisionConfig(
        "int8", calib_data=tiny_onnx.data, quant=QuantConfig(samples=128), cache_dir=str(tmp_path / "calib")
    )
    result = make_precision_graph(tiny_onnx.unrolled, cfg, out=tmp_path / "m.int8.onnx", quiet=True)
    model = onnx.load(str(result.path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    weight_dqs = [n for n in dqs if inits.get(n.input[0]) is not None and inits[n.input[0]].ndim == 2]
    assert weight_dqs and all(inits[n.input[1]].ndim == 1 for n in weight_dqs)  # per-channel weight scales
    assert all(inits[n.input[0]].dtype != np.int32 for n in dqs if n.input[0] in inits)  # no int32 bias DQ
    assert all(not inits[n.input[2]].any() for n in dqs if len(n.input) > 2 and n.input[2] in inits)  # symmetric
    dq_outputs = {n.output[0] for n in dqs}
    fed = [n for n in model.graph.node if any(i in dq_outputs for i in n.input)]  # what Q/DQ feeds
    assert fed and {n.op_type for n in fed} == {"MatMul"}  # MatMul inputs only (no Q/DQ on adds, norms)
    assert not any("lm_head" in n.name or "q_head" in n.name for n in fed)
    fp32, int8 = _accuracy(tiny_onnx.unrolled, heldout), _accuracy(result.path, heldout)
    assert fp32["exact_accuracy"] - int8["exact_accuracy"] <= 0.02, (fp32, int8)


@pytest.mark.slow
def test_calibration_cache_is_keyed_and_reused(tiny_onnx, tmp_path):
    def run(samples, method="minmax"):
        cfg = PrecisionConfig(
            "int8",
            calib_data=tiny_onnx.data,
            cache_dir=str(tmp_path / "calib"),
            quant=QuantConfig(method=method, samples=samples),
        )
        return make_precision_graph(tiny_onnx.step, cfg, out=tmp_path / "s.int8.onnx", quiet=True).report["calibration"]

    first, again, other = run(32), run(32), run(48)
    assert not first["reused"] and again["reused"] and again["key"] == first["key"]
    assert not other["reused"] and other["key"] != first["key"]
    assert len(list((tmp_path / "calib").glob("*.json"))) == 2


def test_int8_without_calibration_data_takes_the_checkpoints_own_or_says_how(tmp_path):
    """No --calib-data: the job preamble takes the checkpoint's own dataset (its provenance); a graph
    whose checkpoint is unknown is refused in one line naming the flag (no scale is invented)."""
    import shutil

    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.train.presets import bundled_checkpoint

    fp32 = export_onnx(bundled_checkpoint("sudoku-tiny"), tmp_path / "t.onnx", ExportConfig(parity=False), quiet=True)
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(fp32.path, alone / "t.onnx")  # no manifest: its checkpoint is unknown
    config = PrecisionConfig("int8", cache_dir=str(tmp_path / "calib"), accuracy_check=False)
    with pytest.raises(ConfigError, match="no --calib-data given and the checkpoint .* unknown.*--calib-data"):
        make_precision_graph(alone / "t.onnx", config, out=tmp_path / "x.int8.onnx", quiet=True)


def test_bad_calibration_data_is_one_clear_error(tmp_path):
    (tmp_path / "x.txt").write_text("nope")
    with pytest.raises(DataError, match="neither a dataset folder nor a .npz"):
        load_examples(tmp_path / "x.txt", 8)
    np.savez(tmp_path / "bad.npz", other=np.zeros(3))
    with pytest.raises(DataError, match="'inputs' array"):
        load_examples(tmp_path / "bad.npz", 8)


@pytest.mark.slow
def test_sensitivity_fallback_keeps_harmful_layers_in_float(tiny_onnx, tmp_path, mlp_costs_five_points):
    """With an accuracy function that punishes quantizing the L-level MLP, the fallback keeps
    exactly those layers in float and reports them."""
    cfg = PrecisionConfig(
        "int8",
        calib_data=tiny_onnx.data,
        accuracy_budget=1.0,
        cache_dir=str(tmp_path / "calib"),
        quant=QuantConfig(method="minmax", samples=32),
    )
    report = make_precision_graph(tiny_onnx.unrolled, cfg, out=tmp_path / "f.int8.onnx", quiet=True).report
    record = report["accuracy"]
    assert record["measured"]["loss_points"] <= 1.0 and len(record["kept_float"]) == 2
    assert {k["weight"] for k in record["kept_float"]} == set(mlp_weights(tiny_onnx.unrolled))
    assert all(record["sensitivity"][k["weight"]] > 0 for k in record["kept_float"])


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_step_and_unrolled_precision_graphs_give_the_same_answers(tiny_onnx, heldout, tmp_path, precision):
    """The single-step graph driven by the host loop and the full unroll agree after conversion too."""
    from hrm_deploy.backends.ort.runner import OrtRunner
    from hrm_deploy.runtime.infer import predict

    cfg = PrecisionConfig(
        precision,
        calib_data=tiny_onnx.data,
        cache_dir=str(tmp_path / "calib"),
        quant=QuantConfig(method="minmax", samples=64),
    )
    answers = []
    for source in (tiny_onnx.unrolled, tiny_onnx.step):
        graph = make_precision_graph(source, cfg, out=tmp_path / f"{source.stem}.{precision}.onnx", quiet=True).path
        runner = OrtRunner(graph)
        runner.activate()
        answers.append(predict(runner, heldout).argmax(-1))
    assert (answers[0] == answers[1]).mean() >= 0.9999


@pytest.mark.slow
def test_every_quantized_graph_is_measured_against_fp32_by_default(tiny_onnx, tmp_path, caplog):
    """No default is silently worse: the INT8 graph's argmax agreement and exact-accuracy delta on
    held-out puzzles are printed in one line and recorded; --no-accuracy-check says it was skipped."""
    import logging

    quant = QuantConfig(samples=32)
    cfg = PrecisionConfig("int8", calib_data=tiny_onnx.data, quant=quant, cache_dir=str(tmp_path / "calib"))
    with caplog.at_level(logging.INFO, logger="hrm_deploy.precision.conductor"):
        result = make_precision_graph(tiny_onnx.unrolled, cfg, out=tmp_path / "m.int8.onnx", quiet=True)
    accuracy = result.report["accuracy"]
    measured = accuracy["measured"]
    assert accuracy["checked"] and accuracy["budget_points"] == 1.0 and measured["holdout_puzzles"] == 200
    assert measured["argmax_agreement_pct"] >= 98.0 and measured["loss_points"] <= 1.0
    lines = [r.getMessage() for r in caplog.records if "vs FP32 on 200 held-out puzzles" in r.getMessage()]
    assert len(lines) == 1 and "argmax agreement" in lines[0] and "points lost" in lines[0]
    manifest = json.loads((tmp_path / "m.int8.onnx.manifest.json").read_text())
    assert manifest["report"]["accuracy"] == accuracy
    skipped = PrecisionConfig(
        "int8", calib_data=tiny_onnx.data, quant=quant, cache_dir=str(tmp_path / "calib"), accuracy_check=False
    )
    off = make_precision_graph(tiny_onnx.unrolled, skipped, out=tmp_path / "off.int8.onnx", quiet=True)
    assert off.report["accuracy"] == {"checked": False, "why": "--no-accuracy-check: not measured against FP32"}


def test_the_build_stage_passes_the_check_to_every_target():
    from hrm_deploy.engines.build import EngineConfig

    assert EngineConfig("int8", target="desktop").accuracy_check
    assert not EngineConfig("int8", target="jetson-orin-8gb", accuracy_check=False).accuracy_check


@pytest.mark.slow
def test_the_accuracy_line_is_logged_once(tiny_onnx, tmp_path, capsys):
    """ORT's quantizer configures the root logger on its first module-level log call; the stage's
    accuracy line then printed twice (once as ``INFO:hrm_deploy...:...``)."""
    import logging

    from hrm_deploy.cli.logs import setup_logging

    root, logger = logging.getLogger(), logging.getLogger("hrm_deploy")
    saved = (list(root.handlers), list(logger.handlers), logger.level)
    root.handlers[:] = []  # a plain interpreter: the CLI's handler only
    try:
        setup_logging(False)
        cfg = PrecisionConfig(
            "int8", calib_data=tiny_onnx.data, quant=QuantConfig(samples=32), cache_dir=str(tmp_path / "calib")
        )
        make_precision_graph(tiny_onnx.unrolled, cfg, out=tmp_path / "m.int8.onnx", quiet=True)
        err = capsys.readouterr().err
    finally:
        root.handlers[:], logger.handlers[:] = saved[0], saved[1]
        logger.setLevel(saved[2])
    lines = [line for line in err.splitlines() if "vs FP32 on" in line]
    assert len(lines) == 1 and not lines[0].startswith("INFO:"), err
