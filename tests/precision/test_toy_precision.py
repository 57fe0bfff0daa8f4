"""Adding a precision is one row in the precision table plus its graph writer (docs/architecture.md):
a toy precision registered that way is calibrated and written by the precision stage, accepted or
refused per target, judged by verify with its own thresholds and looked for by the TensorRT layer
check, none of which names it."""

from __future__ import annotations

import sys
import types

import onnx
import pytest
from onnx import TensorProto

from hrm_deploy.errors import ConfigError
from hrm_deploy.precision import registry
from hrm_deploy.precision.calibrate import QuantConfig
from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph


def write_toy(job, out_path, exclude=()):
    """The toy writer: INT8 Q/DQ with unsigned activations (the U8S8 form), from the job's shared ranges."""
    from hrm_deploy.precision.int8 import quantize_int8

    return quantize_int8(job, out_path, exclude, activations="uint8")


TOY = registry.PrecisionEntry(
    "toyu8",
    "qdq",
    registry.Thresholds(0.5, 50.0, 0.5, 5.0, 5.0),
    "toy_precision:write_toy",
    "hrm_deploy.precision.job:calibrate_job",
    min_capability=(9, 0),
    gpus="Hopper or Blackwell",
    engine_dtype="int8",
)


@pytest.fixture
def toy(monkeypatch):
    module = types.ModuleType("toy_precision")
    module.write_toy = write_toy  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "toy_precision", module)
    monkeypatch.setitem(registry.PRECISIONS, TOY.name, TOY)
    return TOY


@pytest.mark.slow
def test_a_toy_precision_is_one_row_and_one_writer(toy, tiny_onnx, tmp_path):
    config = PrecisionConfig(
        "toyu8", calib_data=tiny_onnx.data, quant=QuantConfig(samples=32), cache_dir=str(tmp_path / "calib")
    )
    result = make_precision_graph(tiny_onnx.step, config, quiet=True, out=tmp_path / "s.toyu8.onnx")
    model = onnx.load(str(result.path))
    quantized = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    inits = {i.name: i for i in model.graph.initializer}
    zero_points = [inits[n.input[2]].data_type for n in quantized if len(n.input) > 2 and n.input[2] in inits]
    assert quantized and TensorProto.UINT8 in zero_points  # the toy writer's graph, not INT8's
    assert result.report["calibration"]["cache"] and not result.report["calibration"]["reused"]
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["hrm_deploy.precision"] == "toyu8"

    from hrm_deploy.verify import verify

    report = verify(result.path, tiny_onnx.data, samples=16, quiet=True)
    assert report["precision"] == "toyu8" and report["thresholds"]["max_exact_drop_points"] == 50.0


def test_a_toy_q_dq_precision_calibrates_on_the_checkpoints_own_data_by_default(toy, tiny_onnx, tmp_path):
    """No data given: the job preamble takes the checkpoint's own dataset (its provenance) and runs the
    toy row's calibration on it."""
    config = PrecisionConfig("toyu8", quant=QuantConfig(samples=8), cache_dir=str(tmp_path), accuracy_check=False)
    result = make_precision_graph(tiny_onnx.unrolled, config, out=tmp_path / "t.toyu8.onnx", quiet=True)
    assert result.report["calibration"]["samples"] == 8 and "datasets" in result.report["calibration"]["data"]


def test_targets_and_the_engine_config_read_the_toy_row(toy):
    from hrm_deploy.engines.build import EngineConfig
    from hrm_deploy.engines.targets import get_target, target_architectures

    assert EngineConfig(precision="toyu8", target="desktop").precision == "toyu8"
    assert target_architectures(get_target("desktop"), "toyu8") == ["12.0"]
    with pytest.raises(ConfigError, match=r"toyu8 needs compute capability >= 9\.0 \(Hopper or Blackwell\)"):
        target_architectures(get_target("jetson-orin-8gb"), "toyu8")
    with pytest.raises(ConfigError, match="toyu8 engines need a GPU"):
        EngineConfig(precision="toyu8", target="cpu")


def test_the_tensorrt_layer_check_looks_for_the_toy_rows_dtype(toy):
    from hrm_deploy.backends.tensorrt.builder.layers import precision_verdict

    summary = {"detail": "detailed", "dtypes": {"fp32": 10}, "fused_dtypes": {}, "with_dtype": 10, "fused": 0}
    assert precision_verdict("toyu8", summary)[0] == "fp32"
    assert precision_verdict("toyu8", {**summary, "dtypes": {"int8": 3}})[0] == "took"
