"""The fallback's candidates are the one all-quantized graph with chosen MatMuls back on float (any
Q/DQ writer's: ORT's INT8, our FP8), and its search over the sensitivity ranking finds the fewest
weights to keep FP32."""

from __future__ import annotations

import numpy as np

from hrm_deploy.precision.fallback import Search, keep_float


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


def test_keep_float_puts_the_excluded_matmul_back_on_float(tmp_path):
    fp32, qdq, _ = _two_matmuls(tmp_path)
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    none_int8 = keep_float(qdq, fp32, {"mm1", "mm2"})
    np.testing.assert_allclose(_run(none_int8, x), _run(fp32, x), rtol=1e-6)  # every Q/DQ gone: FP32 exactly
    assert not [n for n in none_int8.graph.node if "Quantize" in n.op_type]
    assert {t.name for t in none_int8.graph.initializer} == {"W1", "W2"}  # int8 weights no longer read
    probe = keep_float(qdq, fp32, {"mm1"})
    by_name = {n.name: n for n in probe.graph.node}
    assert list(by_name["mm1"].input) == ["x", "W1"]
    assert by_name["mm2"].input[1] != "W2"  # still the dequantized int8 weight
    assert not np.allclose(_run(probe, x), _run(fp32, x), rtol=1e-6)
    assert not np.allclose(_run(probe, x), _run(qdq, x), rtol=1e-6)
    assert len(qdq.graph.node) > len(probe.graph.node)  # the input is not edited


def test_keep_float_edits_any_writers_graph(tmp_path):
    """Our FP8 writer names its Q/DQ tensors its own way: the same edit undoes them, node by node."""
    import onnx

    from hrm_deploy.precision.calibrate import QuantPlan
    from hrm_deploy.precision.fp8 import write_fp8_qdq

    fp32, _, _ = _two_matmuls(tmp_path)
    fp8 = onnx.ModelProto()
    fp8.CopyFrom(fp32)
    write_fp8_qdq(fp8, QuantPlan(["mm1", "mm2"]), {"x": 0.01, "h": 0.02})
    probe = keep_float(fp8, fp32, ("mm2",))
    by_name = {n.name: n for n in probe.graph.node}
    assert list(by_name["mm2"].input) == ["h", "W2"] and by_name["mm1"].input[1] != "W1"
    assert not [n for n in probe.graph.node if n.output[0].startswith(("h/fp8", "W2/fp8"))]  # its Q/DQ gone
    assert not [t for t in probe.graph.initializer if t.name.startswith("W2/fp8")]


def _searched(search: Search, passes_from: int) -> list[int]:
    """Run ``search`` where k >= ``passes_from`` passes its screen; the k screened, in order."""
    seen: list[int] = []
    while (k := search.next()) is not None:
        seen.append(k)
        search.record(k, k >= passes_from)
    return seen


def test_the_search_gallops_up_then_bisects_and_a_refuted_choice_moves_it_up():
    """The smallest k whose screen passes: galloping 1, 2, 4, ... up to the first pass, then
    bisecting below it (one screen when one weight is enough); a choice the whole holdout refutes
    sends the search to larger float sets (never back to a smaller one)."""
    one = Search(9)  # k in 1..8
    assert _searched(one, 1) == [1] and one.best == 1
    search = Search(9)
    assert _searched(search, 3) == [1, 2, 4, 3] and search.best == 3
    search.refute(3)  # certified on the whole holdout: outside after all
    assert search.best is None
    later = _searched(search, 5)
    assert all(k > 3 for k in later) and later == [6, 4, 5] and search.best == 5
    assert search.most() == 6
    nothing = Search(5)
    assert _searched(nothing, 99) == [1, 2, 4] and nothing.best is None and nothing.most() == 4


def test_a_near_miss_is_certified_when_no_screen_passes_with_a_failure_to_spare():
    """A screen within the rule but without a failure to spare is not the search's answer, but when
    no k passes, the smallest such k above every refuted one is certified (the refusal then rests on
    the whole holdout); once refuted, it is not offered again."""
    search = Search(5)  # k in 1..4
    while (k := search.next()) is not None:
        search.record(k, False, near=k >= 2)
    assert search.best is None and search.near_miss() == 2
    search.refute(2)
    assert search.near_miss() == 4  # 4 was near too; 3 was never screened
    search.refute(4)
    assert search.near_miss() is None and search.next() is None
