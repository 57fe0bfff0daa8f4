"""Static INT8's FP32 fallback: probes are the one Q/DQ graph with chosen MatMuls back on float,
and bisection over the sensitivity ranking finds the fewest weights to keep FP32."""

from __future__ import annotations

import numpy as np
import pytest

from hrm_deploy.backends.ort.builder.fallback import float_probe
from hrm_deploy.errors import ConfigError
from hrm_deploy.precision.fallback import bisect_fallback


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


def test_bisection_finds_the_fewest_and_counts_probes():
    sens = {"a": 5.0, "b": 3.0, "c": 1.0, "d": 0.5, "e": 0.1, "f": 0.05, "g": 0.01, "h": 0.0}
    seen: list[list[str]] = []

    def measure(kept):
        seen.append(list(kept))
        return sum(sens.values()) - sum(sens[k] for k in kept)  # what the kept ones no longer lose

    chosen = bisect_fallback(list(sens), sens.__getitem__, measure, lambda loss: loss <= 0.7, lambda q: "no")
    assert chosen.kept_float == ["a", "b", "c"]  # 0.66 left; keeping two leaves 1.66
    assert chosen.probes == len(seen) <= 3  # log2(8) bisection probes, not up to 7 greedy; ranking is no probe
    assert chosen.limits["stopped"] is None
    with pytest.raises(ConfigError, match="never"):
        bisect_fallback(list(sens), sens.__getitem__, measure, lambda loss: False, lambda q: "never")


def test_the_bisection_is_bounded_in_probes_and_says_so():
    """Past its probe bound the search keeps the smallest mix it measured within the budget, and
    the record says it stopped; with none within, the refusal says the search stopped."""
    sens = {name: float(10 - i) for i, name in enumerate("abcdefghij")}
    seen: list[int] = []

    def measure(kept):
        seen.append(len(kept))
        return len(kept)

    chosen = bisect_fallback(list(sens), sens.__getitem__, measure, lambda n: n >= 2, lambda q: "no", max_probes=1)
    assert len(seen) == 1 and chosen.probes == 1 and len(chosen.kept_float) == seen[0]
    assert "after 1 probes" in chosen.limits["stopped"]
    with pytest.raises(ConfigError, match=r"never \(the fallback search stopped: bounds reached after 2 probes"):
        bisect_fallback(list(sens), sens.__getitem__, measure, lambda n: False, lambda q: "never", max_probes=2)
