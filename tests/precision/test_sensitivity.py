"""The fallback's cheap ranking: each quantized weight's own output error from one pass of the Q/DQ
graph with float twins (hrm_deploy/precision/sensitivity.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper


def _job_and_qdq(tiny_onnx, tmp_path):
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.onnx_runtime import load_onnx
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.int8 import quantize_int8
    from hrm_deploy.precision.job import calibrate_job, new_job

    model = load_onnx(tiny_onnx.step, weights=True)
    examples = load_examples(tiny_onnx.data, 16)
    job = new_job(
        Path(tiny_onnx.step), model, graph_metadata(model), examples, QuantConfig(samples=16), tmp_path, "x" * 64
    )
    calibrate_job(job)
    quantize_int8(job, tmp_path / "q.onnx")
    return job, onnx.load(str(tmp_path / "q.onnx"))


@pytest.mark.slow
def test_a_weight_whose_quantization_is_broken_ranks_first(tiny_onnx, tmp_path):
    """Every weight gets a small positive error; scaling one weight's quantized values by 3 (a
    quantization gone wrong) makes it the largest by far, from one run on a few puzzles."""
    from hrm_deploy.precision.fallback import weight_groups
    from hrm_deploy.precision.sensitivity import local_errors

    job, qdq = _job_and_qdq(tiny_onnx, tmp_path)
    groups = weight_groups(job.model, job.plan.quantize)
    errors = local_errors(qdq, job.model, groups, job.examples, job.source, job.meta)
    assert set(errors) == set(groups) and all(0.0 < e < 0.2 for e in errors.values()), errors

    victim = sorted(groups)[1]
    node = next(n for n in qdq.graph.node if n.name == groups[victim][0])
    dq = next(n for n in qdq.graph.node if n.output[0] == node.input[1])  # the weight's DequantizeLinear
    scale = next(t for t in qdq.graph.initializer if t.name == dq.input[1])
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * np.float32(3.0), scale.name))
    broken = local_errors(qdq, job.model, groups, job.examples, job.source, job.meta)
    assert max(broken, key=broken.__getitem__) == victim and broken[victim] > 1.0
