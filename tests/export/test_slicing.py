import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
from hrm_deploy.export.parity import ort_session, sample_inputs
from hrm_deploy.export.slicing import INDEX_PREFIX, slices_to_gathers

INT64_MAX = 2**63 - 1


def _slices_graph() -> onnx.ModelProto:
    """x [batch, 6, 10]: the static slices HRM's tracer emits, plus ones the pass must leave alone."""
    consts = {
        "lo": [-4],  # counted from the end: 6..10
        "hi": [INT64_MAX],
        "ax2": [2],
        "zero": [0],
        "two": [2],
        "axm1": [-1],  # the last axis, counted from the end
        "one": [1],
        "far": [100],  # clamped to the axis' size
        "sizes": [2, 8],
    }
    nodes = [
        helper.make_node("Slice", ["x", "lo", "hi", "ax2"], ["tail"], name="tail"),
        helper.make_node("Slice", ["x", "zero", "two", "axm1"], ["head"], name="head"),
        helper.make_node("Slice", ["x", "one", "far", "one"], ["rows"], name="rows"),
        helper.make_node("Split", ["x", "sizes"], ["s0", "s1"], name="split_sizes", axis=-1),
        helper.make_node("Split", ["x"], ["u0", "u1", "u2", "u3"], name="split_uneven", axis=2, num_outputs=4),
        helper.make_node("Slice", ["x", "zero", "one", "zero"], ["batch_row"], name="on_batch"),  # dynamic axis
        helper.make_node("Slice", ["x", "zero", "hi", "ax2", "two"], ["strided"], name="strided"),  # step 2
    ]
    outputs = ["tail", "head", "rows", "s0", "s1", "u0", "u1", "u2", "u3", "batch_row", "strided"]
    graph = helper.make_graph(
        nodes,
        "slices",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6, 10])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [None] * 3) for o in outputs],
        initializer=[numpy_helper.from_array(np.array(v, dtype=np.int64), k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def test_static_slices_become_gathers_with_the_same_elements():
    model = _slices_graph()
    rewritten, count = slices_to_gathers(model)
    assert count == 5  # three slices and both splits; the batch-axis and strided slices stay
    onnx.checker.check_model(rewritten)
    onnx.shape_inference.infer_shapes(rewritten, strict_mode=True)
    ops = {n.name: n.op_type for n in rewritten.graph.node}
    assert ops["tail"] == ops["head"] == ops["rows"] == "Gather" and ops["on_batch"] == ops["strided"] == "Slice"
    assert [n.name for n in rewritten.graph.node if n.name.startswith("split_uneven")] == [
        f"split_uneven/gather_{k}" for k in range(4)
    ]
    indices = {t.name: numpy_helper.to_array(t) for t in rewritten.graph.initializer if t.name.startswith(INDEX_PREFIX)}
    assert all(v.dtype == np.int32 for v in indices.values())
    # head (x[..., 0:2]) and the first output of split_sizes share one index constant; the
    # uneven split gives ceil(10 / 4) = 3 columns to each output but the last
    ranges = ("6_10", "0_2", "1_6", "2_10", "0_3", "3_6", "6_9", "9_10")
    assert sorted(indices) == sorted(INDEX_PREFIX + r for r in ranges)
    assert "sizes" not in {t.name for t in rewritten.graph.initializer}  # the splits' sizes are dead
    before, after = ort_session(model.SerializeToString()), ort_session(rewritten.SerializeToString())
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 6, 10), dtype=np.float32)
        for a, b in zip(before.run(None, {"x": x}), after.run(None, {"x": x}), strict=True):
            assert a.shape == b.shape and np.array_equal(a, b)


def test_a_graph_without_static_slices_is_returned_as_is():
    model = _slices_graph()
    keep = {"on_batch", "strided"}
    kept = [n for n in model.graph.node if n.name in keep]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    del model.graph.output[:]
    model.graph.output.extend(
        helper.make_tensor_value_info(o, TensorProto.FLOAT, [None] * 3) for o in ("batch_row", "strided")
    )
    same, count = slices_to_gathers(model)
    assert count == 0 and same is model


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["unrolled", "step"])
def test_exported_graphs_rewritten_have_no_slices_left_and_the_same_outputs(tmp_path, tiny_model, mode):
    """The export keeps its slices (ONNX Runtime's CPU runs them ~3x faster than gathers); the
    TensorRT build parses the rewritten copy (the TensorRT builder's _for_tensorrt)."""
    plain = export_onnx(tiny_model, tmp_path / "p.onnx", ExportConfig(mode=mode, parity=False), quiet=True)
    assert {"Slice", "Split"} & {n.op_type for n in onnx.load(plain.path).graph.node}
    rewritten, count = slices_to_gathers(onnx.load(plain.path))
    assert count > 0 and not {"Slice", "Split"} & {n.op_type for n in rewritten.graph.node}
    cfg = tiny_model.config
    gathered, sliced = ort_session(rewritten.SerializeToString()), ort_session(str(plain.path))
    for batch in (1, 5):
        feeds = sample_inputs(cfg, batch, seed=batch)
        if mode == "step":
            rng = np.random.default_rng(batch)
            state = (batch, cfg.total_seq_len, cfg.hidden_size)
            feeds.update(
                z_H=rng.standard_normal(state, dtype=np.float32),
                z_L=rng.standard_normal(state, dtype=np.float32),
                reset=np.arange(batch) % 2 == 0,
            )
        for a, b in zip(gathered.run(None, feeds), sliced.run(None, feeds), strict=True):
            assert np.array_equal(a, b)
