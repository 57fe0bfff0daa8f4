"""The INT8 writer's quick rewiring (:func:`hrm_deploy.precision.int8.quick_rewiring`) writes ONNX
Runtime's own graph, byte for byte, and leaves ORT's method as it found it."""

from __future__ import annotations

import contextlib
from pathlib import Path


def test_the_quick_rewiring_writes_the_graph_ort_writes(tiny_onnx, tmp_path, monkeypatch):
    from onnxruntime.quantization.onnx_model import ONNXModel

    import hrm_deploy.precision.int8 as int8
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.onnx_runtime import load_onnx
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.job import calibrate_job, new_job

    model = load_onnx(tiny_onnx.step, weights=True)
    job = new_job(
        Path(tiny_onnx.step),
        model,
        graph_metadata(model),
        load_examples(tiny_onnx.data, 16),
        QuantConfig(samples=16),
        tmp_path,
        "x" * 64,
    )
    calibrate_job(job)
    ort_own = ONNXModel.replace_input_of_all_nodes
    int8.quantize_int8(job, tmp_path / "quick.onnx", exclude=(job.plan.quantize[0],))
    assert ONNXModel.replace_input_of_all_nodes is ort_own
    monkeypatch.setattr(int8, "quick_rewiring", contextlib.nullcontext)
    int8.quantize_int8(job, tmp_path / "ort.onnx", exclude=(job.plan.quantize[0],))
    quick, ort = (tmp_path / "quick.onnx").read_bytes(), (tmp_path / "ort.onnx").read_bytes()
    assert quick == ort and b"DequantizeLinear" in quick
