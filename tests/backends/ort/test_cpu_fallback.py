"""Static INT8's candidates are the one Q/DQ graph with chosen MatMuls back on float, and the
fallback's bisection over the sensitivity ranking finds the fewest weights to keep FP32."""

from __future__ import annotations

import numpy as np

from hrm_deploy.backends.ort.builder.fallback import float_probe
from hrm_deploy.precision.fallback import Bisection


def _two_matmuls(tmp_path):
    """x -> MatMul(W1) -> MatMul(W2) -> y, as FP32 and as ORT's static Q/DQ graph of both."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((8, 8)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
            helper.make_node("MatMul", ["h", "W2"], ["y"], name="mm2"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")],
    )
    fp32 = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    fp32.ir_version = 9
    onnx.save(fp32, tmp_path / "f.onnx")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter([{"x": rng.standard_normal((4, 8)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    def quantize(out, nodes):
        quantize_static(
            str(tmp_path / "f.onnx"),
            str(out),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            nodes_to_quantize=nodes,
            op_types_to_quantize=["MatMul"],
            extra_options={
                "ActivationSymmetric": True,
                "WeightSymmetric": True,
                "OpTypesToExcludeOutputQuantization": ["MatMul"],  # as the static recipe: inputs only
            },
        )
        return onnx.load(str(out))

    return fp32, quantize(tmp_path / "q.onnx", ["mm1", "mm2"]), quantize


def _run(model, x):
    from hrm_deploy.onnx_runtime import ort_session

    return ort_session(model.SerializeToString(), threads=1).run(None, {"x": x})[0]


def test_float_probe_puts_the_excluded_matmul_back_on_float(tmp_path):
    fp32, qdq, _ = _two_matmuls(tmp_path)
    weights = {t.name: t for t in fp32.graph.initializer}
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    none_int8 = float_probe(qdq, weights, {"mm1", "mm2"})
    np.testing.assert_allclose(_run(none_int8, x), _run(fp32, x), rtol=1e-6)  # every Q/DQ gone: FP32 exactly
    assert not [n for n in none_int8.graph.node if "Quantize" in n.op_type]
    assert {t.name for t in none_int8.graph.initializer} == {"W1", "W2"}  # int8 weights no longer read
    probe = float_probe(qdq, weights, {"mm1"})
    by_name = {n.name: n for n in probe.graph.node}
    assert list(by_name["mm1"].input) == ["x", "W1"]
    assert by_name["mm2"].input[1] != "W2"  # still the dequantized int8 weight
    assert not np.allclose(_run(probe, x), _run(fp32, x), rtol=1e-6)
    assert not np.allclose(_run(probe, x), _run(qdq, x), rtol=1e-6)
    assert len(qdq.graph.node) > len(probe.graph.node)  # the input is not edited


def test_bisection_finds_the_fewest_and_a_refuted_choice_moves_it_up():
    """The smallest k whose screen passes, in log2(weights) screens; a choice the whole holdout
    refutes sends the search to larger float sets (never back to a smaller one)."""
    passes_from = 3  # k >= 3 kept float passes
    bisection = Bisection(9)  # k in 1..8
    seen: list[int] = []
    while (k := bisection.next()) is not None:
        seen.append(k)
        bisection.record(k, k >= passes_from)
    assert bisection.best == 3 and len(seen) <= (8).bit_length()
    bisection.refute(3)  # certified on the whole holdout: outside after all
    assert bisection.best is None
    while (k := bisection.next()) is not None:
        assert k > 3
        seen.append(k)
        bisection.record(k, True)
    assert bisection.best == 4 and bisection.most() == max(seen)
    nothing = Bisection(5)
    while (k := nothing.next()) is not None:
        nothing.record(k, False)
    assert nothing.best is None and nothing.most() == 4
