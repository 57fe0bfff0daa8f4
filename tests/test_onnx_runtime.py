"""The one ONNX Runtime session factory: options recorded as asked, providers checked, offline
optimization written; plus the runner's use of it."""

from __future__ import annotations

import numpy as np
import pytest

from hrm_deploy.errors import ConfigError, DependencyError
from hrm_deploy.onnx_runtime import LogSeverity, Optimization, ort_session, provider_name

ort = pytest.importorskip("onnxruntime")


@pytest.fixture
def graph(tmp_path):
    """y = x + x behind an Identity, which ORT's basic passes remove (so optimizing shows)."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Add", ["i", "i"], ["y"])]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    path = tmp_path / "g.onnx"
    onnx.save(model, str(path))
    return path


def test_options_are_recorded_as_asked(graph):
    session = ort_session(graph, threads=2, optimization=Optimization.BASIC, log_severity=LogSeverity.FATAL)
    options = session.get_session_options()
    assert options.intra_op_num_threads == 2
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.log_severity_level == 4
    assert session.get_providers() == ["CPUExecutionProvider"]
    np.testing.assert_array_equal(session.run(None, {"x": np.arange(3, dtype=np.float32)})[0], [0, 2, 4])
    default = ort_session(graph.read_bytes()).get_session_options()  # serialized graphs too
    assert default.intra_op_num_threads == 0  # ORT's own choice, one per core
    assert default.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert default.log_severity_level == 3


def test_an_unknown_provider_is_one_clear_line(graph):
    with pytest.raises(ConfigError) as raised:
        ort_session(graph, provider="gpu")
    assert str(raised.value) == "ORT provider 'gpu' unknown; use one of cpu, cuda, tensorrt"
    assert provider_name("cuda") == "CUDAExecutionProvider"
    assert provider_name("AzureExecutionProvider") == "AzureExecutionProvider"  # ORT's own names pass


def test_the_runner_refuses_an_unknown_provider_before_any_work(tmp_path):
    from hrm_deploy.backends.ort.runner import OrtRunner

    with pytest.raises(ConfigError, match="provider 'gpu' unknown"):
        OrtRunner(tmp_path / "missing.onnx", provider="gpu")


def test_optimized_model_is_written_where_asked(graph, tmp_path):
    import onnx

    out = tmp_path / "g.opt.onnx"
    ort_session(graph, optimization=Optimization.EXTENDED, optimized_model_path=out)
    assert [n.op_type for n in onnx.load(str(out)).graph.node] == ["Add"]  # the Identity is gone
    np.testing.assert_array_equal(ort_session(out).run(None, {"x": np.ones(2, np.float32)})[0], [2, 2])
    kept = tmp_path / "g.kept.onnx"
    ort_session(graph, optimization=Optimization.DISABLED, optimized_model_path=kept)  # the level reaches ORT
    assert [n.op_type for n in onnx.load(str(kept)).graph.node] == ["Identity", "Add"]


@pytest.mark.skipif(
    "CUDAExecutionProvider" in ort.get_available_providers(), reason="CUDA runs here: nothing falls back"
)
@pytest.mark.filterwarnings("ignore:Specified provider:UserWarning")  # ORT's own note on the missing provider
def test_a_silent_fallback_to_cpu_is_refused_unless_allowed(graph):
    with pytest.raises(DependencyError, match="fell back to CPUExecutionProvider instead of CUDAExecutionProvider"):
        ort_session(graph, provider="cuda")
    probe = ort_session(graph, provider="cuda", log_severity=LogSeverity.FATAL, allow_fallback=True)
    assert probe.get_providers()[0] == "CPUExecutionProvider"  # what the doctor reports
