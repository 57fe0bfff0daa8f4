"""The INT8 writer's quick rewiring (:func:`hrm_deploy.precision.int8.quick_rewiring`) writes ONNX
Runtime's own graph, byte for byte, and leaves ORT's method as it found it."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest


@pytest.fixture(params=["tiny step graph", "bundled 8-step unroll"])
def graph_and_data(request, tiny_onnx, small_onnx, trained_small):
    if request.param == "tiny step graph":
        return Path(tiny_onnx.step), tiny_onnx.data
    return Path(small_onnx), trained_small.data  # 2,486 nodes, each tensor read at many places


def test_the_quick_rewiring_writes_the_graph_ort_writes(graph_and_data, tmp_path, monkeypatch):
    from onnxruntime.quantization.onnx_model import ONNXModel

    import hrm_deploy.precision.int8 as int8
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.onnx_runtime import load_onnx
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.job import calibrate_job, new_job

    path, data = graph_and_data
    model = load_onnx(path, weights=True)
    examples = load_examples(data, 16)
    job = new_job(path, model, graph_metadata(model), examples, QuantConfig(samples=16), tmp_path, "x" * 64)
    calibrate_job(job)
    ort_own = ONNXModel.replace_input_of_all_nodes
    for exclude in ((), tuple(job.plan.quantize[:3])):
        with monkeypatch.context() as patch:
            int8.quantize_int8(job, tmp_path / "quick.onnx", exclude=exclude)
            assert ONNXModel.replace_input_of_all_nodes is ort_own
            patch.setattr(int8, "quick_rewiring", contextlib.nullcontext)
            int8.quantize_int8(job, tmp_path / "ort.onnx", exclude=exclude)
        quick, ort = (tmp_path / "quick.onnx").read_bytes(), (tmp_path / "ort.onnx").read_bytes()
        assert quick == ort and b"DequantizeLinear" in quick
