"""NVFP4 graphs (FP4 E2M1, block 16, E4M3 block scales, float32 tensor scale) and their CPU simulation."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from hrm_deploy.backends.tensorrt.builder.options import TensorRTOptions
from hrm_deploy.errors import ConfigError
from hrm_deploy.precision.calibrate import QuantConfig
from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph
from hrm_deploy.precision.nvfp4 import (
    DYNAMIC_QUANTIZE,
    dequantize_weight,
    e2m1_round,
    e4m3_round,
    fake_quantize,
    pack_e2m1,
    quantize_blocks,
    simulate_on_cpu,
    tensor_scale,
    unpack_e2m1,
)
from tests.conftest import mlp_weights


def _nvfp4(onnx_path, data, tmp_path, **kw):
    kw.setdefault("accuracy_check", "accuracy_budget" in kw)  # the graph's form; the check has its own tests
    cfg = PrecisionConfig("nvfp4", calib_data=data, cache_dir=str(tmp_path / "calib"), **kw)
    return make_precision_graph(onnx_path, cfg, out=tmp_path / "m.nvfp4.onnx", quiet=True)


def test_e2m1_rounds_to_the_eight_magnitudes_ties_to_even_and_saturates():
    x = [0, 0.2, 0.25, 0.26, 0.5, 0.74, 0.75, 1.1, 1.25, 1.3, 1.75, 2.4, 2.5, 2.6, 3.49, 3.5, 4.9, 5.0, 5.1, 6, 7, 1e6]
    want = [0, 0, 0, 0.5, 0.5, 0.5, 1, 1, 1, 1.5, 2, 2, 2, 3, 3, 4, 4, 4, 6, 6, 6, 6]
    assert e2m1_round(np.array(x)).tolist() == want
    assert e2m1_round(-np.array(x)).tolist() == [-w for w in want]
    grid = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert sorted(set(np.abs(e2m1_round(np.linspace(-9, 9, 10001))).tolist())) == grid


def test_block_scales_are_e4m3_of_block_amax_over_six_times_the_tensor_scale():
    assert tensor_scale(6 * 448) == np.float32(1.0)
    scale = np.float32(1.0)
    x = np.zeros((3, 16), np.float32)
    x[0, :4] = [3.0, -1.5, 0.74, 0.2]  # amax 3 -> block scale 0.5 (exact in E4M3)
    x[1, :2] = [1.8, 0.9]  # amax 1.8 -> 0.3 -> E4M3 0.3125 (0.28125 and 0.3125 are its neighbours)
    values, block = quantize_blocks(x, scale)
    assert block.tolist() == [[0.5], [0.3125], [2.0**-9]]  # an all-zero block: the smallest E4M3 scale, values 0
    assert values[0, :4].tolist() == [6, -3, 1.5, 0.5]  # 3/0.5, -1.5/0.5, 0.74/0.5=1.48, 0.2/0.5=0.4
    assert values[1, :2].tolist() == [6, 3]  # 5.76 -> 6 (saturating after the scale rounded down), 2.88 -> 3
    assert not values[2].any()
    assert fake_quantize(x, scale)[1, :2].tolist() == [1.875, 0.9375]
    assert e4m3_round(np.array([0.3, 500.0])).tolist() == [0.3125, 448.0]
    # a tensor: the largest block scale lands on 448 (E4M3's top), others below it
    w = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    assert quantize_blocks(w, tensor_scale(np.abs(w).max()))[1].max() == 448.0


def test_e2m1_packing_is_two_per_byte_low_nibble_first():
    values = np.array([0.5, -6, 1, 0], np.float32)  # codes 1, 15, 2, 0
    assert pack_e2m1(values) == bytes([0xF1, 0x02])
    q = e2m1_round(np.random.default_rng(1).uniform(-7, 7, (6, 32)))
    assert np.array_equal(unpack_e2m1(pack_e2m1(q), q.shape), q)


def _consumers(model):
    out = {}
    for n in model.graph.node:
        for i in n.input:
            out.setdefault(i, []).append(n)
    return out


def test_nvfp4_graph_is_in_tensorrts_form(tiny_onnx, tmp_path):
    result = _nvfp4(tiny_onnx.unrolled, tiny_onnx.data, tmp_path, quant=QuantConfig(samples=32))
    model = onnx.load(str(result.path))
    onnx.checker.check_model(model)
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == 23
    assert any(o.domain == "trt" for o in model.opset_import)
    by_output = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name: i for i in model.graph.initializer}
    attrs = lambda node: {a.name: helper.get_attribute_value(a) for a in node.attribute}  # noqa: E731
    quantized = [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[0] in by_output]
    quantized = [n for n in quantized if by_output[n.input[0]].op_type == "DequantizeLinear"]
    assert len(quantized) == result.report["quantized_nodes"] > 0
    for node in quantized:
        act = by_output[node.input[0]]
        assert attrs(act) == {"axis": -1, "block_size": 16}
        dyn = by_output[act.input[0]]
        assert dyn.op_type == DYNAMIC_QUANTIZE and dyn.domain == "trt"
        assert attrs(dyn) == {"axis": -1, "block_size": 16, "scale_type": TensorProto.FLOAT8E4M3FN}
        assert by_output[act.input[1]].input[0] == dyn.output[1]  # block scales dequantized by the tensor scale
        transpose = by_output[node.input[1]]
        assert transpose.op_type == "Transpose"  # MatMul takes [K, N]; stored [N, K]
        weight = by_output[transpose.input[0]]
        assert attrs(weight) == {"axis": -1, "block_size": 16}
        e2m1, scale_dq = inits[weight.input[0]], by_output[weight.input[1]]
        block, tensor = inits[scale_dq.input[0]], inits[scale_dq.input[1]]
        assert e2m1.data_type == TensorProto.FLOAT4E2M1 and block.data_type == TensorProto.FLOAT8E4M3FN
        assert list(block.dims) == [e2m1.dims[0], e2m1.dims[1] // 16] and not tensor.dims
    assert not any("lm_head" in n.name or "q_head" in n.name for n in quantized)
    # Q/DQ feeds the GEMMs only (the float islands are INT8's and FP8's)
    consumers = _consumers(model)
    dq_out = [n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"]
    allowed = ("MatMul", "Gemm", "Transpose", "DequantizeLinear")  # the GEMM, or the next step of its Q/DQ chain
    assert all(c.op_type in allowed for o in dq_out for c in consumers[o])
    assert next(p.value for p in model.metadata_props if p.key == "hrm_deploy.precision") == "nvfp4"


def test_simulated_weights_equal_what_the_onnx_graph_says(tiny_onnx, tmp_path):
    """The simulation's float weights = ONNX's reference DequantizeLinear-23 of the stored FP4 bytes =
    the numpy quantize-dequantize of the FP32 weights."""
    from onnx import numpy_helper
    from onnx.reference import ReferenceEvaluator

    result = _nvfp4(tiny_onnx.unrolled, tiny_onnx.data, tmp_path, quant=QuantConfig(samples=32))
    model = onnx.load(str(result.path))
    fp32 = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tiny_onnx.unrolled)).graph.initializer}
    sim = {i.name: numpy_helper.to_array(i) for i in simulate_on_cpu(model).graph.initializer}
    inits = {i.name: i for i in model.graph.initializer}
    by_output = {o: n for n in model.graph.node for o in n.output}
    checked = 0
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
            continue
        if inits[node.input[0]].data_type != TensorProto.FLOAT4E2M1:
            continue
        scale_dq = by_output[node.input[1]]
        names = [node.input[0], *scale_dq.input]
        graph = helper.make_graph(
            [scale_dq, node],
            "dq",
            [],
            [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None)],
            [inits[n] for n in names],
        )
        said = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])).run(None, {})[
            0
        ]
        assert np.array_equal(said, sim[node.output[0]])
        assert np.array_equal(said, dequantize_weight(*(inits[n] for n in names)))
        original = fp32[node.input[0].removesuffix("/nvfp4/e2m1")].T  # MatMul [K, N] -> [N, K]
        assert np.array_equal(said, fake_quantize(original, tensor_scale(np.abs(original).max())))
        checked += 1
    assert checked > 0


def test_simulated_dynamic_quantization_equals_the_numpy_reference(tmp_path):
    """The float operators standing in for TRT_FP4DynamicQuantize + its two DequantizeLinear nodes
    give bit for bit the numpy NVFP4 quantize-dequantize (ties, saturation, zero blocks included)."""
    import onnxruntime as ort

    rng = np.random.default_rng(3)
    x = (rng.standard_normal((2, 5, 64)) * rng.uniform(0.01, 20, (2, 5, 64))).astype(np.float32)
    x[0, 0, :16] = 0.0
    x[0, 1, :16] = [6, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.25, -0.75, -2.5, -5, 0.1, 4.9, 3.4, 2.4]
    amax = 7.0
    graph = helper.make_graph(
        [
            helper.make_node(DYNAMIC_QUANTIZE, ["x", "g"], ["q", "s"], domain="trt", axis=-1, block_size=16),
            helper.make_node("DequantizeLinear", ["s", "g"], ["s32"]),
            helper.make_node("DequantizeLinear", ["q", "s32"], ["y"], axis=-1, block_size=16),
        ],
        "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, 64])],
        [onnx.numpy_helper.from_array(tensor_scale(amax), "g")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23), helper.make_opsetid("trt", 1)])
    sim = simulate_on_cpu(model)
    assert not any(n.domain == "trt" for n in sim.graph.node)
    got = ort.InferenceSession(sim.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = fake_quantize(x, tensor_scale(amax))
    assert np.array_equal(got, want)
    assert np.array_equal(got[0, 0, :16], np.zeros(16)) and len(np.unique(np.abs(got[0, 1, :16]))) > 4


def test_nvfp4_shares_the_calibration_cache(tiny_onnx, tmp_path):
    quant = QuantConfig(samples=32)
    int8 = PrecisionConfig("int8", calib_data=tiny_onnx.data, cache_dir=str(tmp_path / "calib"), quant=quant)
    make_precision_graph(tiny_onnx.unrolled, int8, out=tmp_path / "m.int8.onnx", quiet=True)
    assert _nvfp4(tiny_onnx.unrolled, tiny_onnx.data, tmp_path, quant=quant).report["calibration"]["reused"]


def test_nvfp4_budget_fallback_keeps_harmful_layers_in_float(tiny_onnx, tmp_path, mlp_costs_five_points):
    """The fallback's logic on NVFP4 (each quantized L-level MLP weight answers 5 % more puzzles wrong):
    ranked by one screen per weight alone quantized (no Q/DQ activation to read), then bisected."""
    budget = _nvfp4(tiny_onnx.unrolled, tiny_onnx.data, tmp_path, accuracy_budget=1.0, quant=QuantConfig(samples=32))
    report = budget.report["accuracy"]
    assert report["measured"]["loss_points"] <= 1.0 and report["all_quantized"]["loss_points"] > 1.0
    assert {k["weight"] for k in report["kept_float"]} >= set(mlp_weights(tiny_onnx.unrolled))
    assert "one screen per weight" in report["fallback"]["ranking"]
    model = onnx.load(str(budget.path))  # the report counts what the published graph quantizes
    dq = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    quantized = [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and n.input[0] in dq]
    assert budget.report["quantized_nodes"] == len(quantized)


@pytest.mark.slow
def test_nvfp4_budget_holds_on_the_trained_act_model(small_onnx, trained_small, tmp_path):
    """Plain NVFP4 loses many points on the trained 8-step model; with a 2-point budget the fallback
    keeps layers in float until the simulated graph is within it, and says which."""
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.precision.accuracy import onnx_accuracy
    from hrm_deploy.precision.nvfp4 import cpu_runnable

    fp32 = small_onnx
    result = _nvfp4(fp32, trained_small.data, tmp_path, accuracy_budget=2.0, holdout_samples=100)
    report = result.report["accuracy"]
    assert report["kept_float"] and report["measured"]["loss_points"] <= 2.0, report
    assert set(report["sensitivity"]) >= {k["weight"] for k in report["kept_float"]}
    holdout = load_examples(trained_small.data, report["measured"]["holdout_puzzles"], split="test")
    with cpu_runnable(result.path) as sim:  # the published graph is the one measured
        assert 100.0 * onnx_accuracy(sim, holdout)["exact_accuracy"] == pytest.approx(report["measured"]["exact_pct"])


def test_targets_refuse_nvfp4_below_blackwell_before_any_work(tiny_onnx, tmp_path, monkeypatch):
    from hrm_deploy.backends.tensorrt.api import load_backend
    from hrm_deploy.backends.tensorrt.builder import engine as trt_build
    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.engines.targets import get_target, target_architectures

    assert target_architectures(get_target("desktop"), "nvfp4") == ["12.0"]
    with pytest.raises(ConfigError, match=r"nvfp4 needs compute capability >= 10.0.*SM89 is 8.9: use --fp8, --int8"):
        target_architectures(get_target("desktop"), "nvfp4", "SM89")
    with pytest.raises(ConfigError, match=r"nvfp4 needs compute capability >= 10.0.*9.0"):
        target_architectures(get_target("datacenter"), "nvfp4", machine="9.0")  # an H100
    with pytest.raises(ConfigError, match="nvfp4 engines need a GPU of compute capability >= 10.0"):
        EngineConfig("nvfp4", target="cpu")
    monkeypatch.chdir(tmp_path)
    try:
        backend = load_backend("tensorrt-rtx")
    except Exception:  # noqa: BLE001 - tensorrt-rtx not installed
        pytest.skip("tensorrt-rtx is not installed")
    monkeypatch.setattr(trt_build, "load_backend", lambda name: backend)
    with pytest.raises(ConfigError, match="jetson-orin-8gb is 8.7"):
        build_engine(tiny_onnx.unrolled, EngineConfig("nvfp4", target="jetson-orin-8gb", calib_data=tiny_onnx.data))
    assert not (tmp_path / "calib").exists()  # refused before calibrating


@pytest.mark.slow
@pytest.mark.trt
def test_rtx_builds_an_nvfp4_engine_on_cpu_for_blackwell(tiny_onnx, tmp_path, monkeypatch):
    """TensorRT-RTX parses the NVFP4 graph (FP4 weights, DynamicQuantize activations) and builds it
    ahead of time for SM120 without a GPU."""
    import json

    from hrm_deploy.backends.tensorrt.api import load_backend
    from hrm_deploy.engines.build import EngineConfig, build_engine

    try:
        load_backend("tensorrt-rtx")
    except Exception:  # noqa: BLE001 - tensorrt-rtx not installed
        pytest.skip("tensorrt-rtx is not installed")
    monkeypatch.chdir(tmp_path)
    config = EngineConfig(
        "nvfp4",
        calib_data=tiny_onnx.data,
        calib_samples=64,
        max_batch=16,
        accuracy_check=False,  # the engine's form; the default check has tests of its own
        options=TensorRTOptions(compute_capability="SM120"),
    )
    result = build_engine(tiny_onnx.unrolled, config, out=tmp_path / "m.nvfp4.engine", quiet=True)
    manifest = json.loads(result.manifest.read_text())
    assert manifest["precision"] == "nvfp4" and manifest["architectures"] == ["12.0"]
    network = manifest["build"]["network"]
    assert network["qdq_layers"] > 0 and network["output_dtypes"].get("FP4", 0) > 0


def test_an_nvfp4_engine_must_show_fp4_tensors_where_a_gpu_inspects_it():
    from hrm_deploy.backends.tensorrt.builder.layers import precision_verdict, summarize_layers

    def gemm(fmt):
        return {"Name": "gemm", "LayerType": "gemm", "Precision": fmt}

    assert precision_verdict("nvfp4", summarize_layers([gemm("FP32")]))[0] == "fp32"
    assert precision_verdict("nvfp4", summarize_layers([gemm("FP8")]))[0] == "fp32"
    assert precision_verdict("nvfp4", summarize_layers([gemm("FP4")]))[0] == "took"


def test_verify_judges_nvfp4_by_its_own_bounds():
    """An NVFP4 engine within a 1-point budget (as measured on the bundled model) passes verify; plain
    NVFP4 of that model does not; neither would under FP32's bounds, which verify used before."""
    from hrm_deploy.precision.registry import PRECISIONS
    from hrm_deploy.verify import judge

    def report(argmax, logits_rel, q_rel, q_sign, drop):
        closeness = {"scale": 1.0, "max_abs": 1.0, "max_rel": logits_rel, "max_rel_agreeing": logits_rel}
        return {
            "logits": {**closeness, "argmax_agreement": argmax},
            "q_halt": {**closeness, "max_rel": q_rel, "max_rel_agreeing": q_rel, "sign_agreement": q_sign},
            "reference": {"exact_accuracy": 0.833},
            "candidate": {"exact_accuracy": 0.833 - drop / 100},
        }

    within_budget, plain = report(0.997, 0.53, 0.80, 0.955, 2.0), report(0.991, 0.87, 1.03, 0.851, 16.2)
    assert judge(within_budget, PRECISIONS["nvfp4"].thresholds) == []
    assert len(judge(plain, PRECISIONS["nvfp4"].thresholds)) == 4
    assert judge(within_budget, PRECISIONS["fp32"].thresholds)


def test_gemms_fp4_cannot_take_stay_float_and_say_why():
    """K not a multiple of 16 (and 4-D activations) are kept in float with the reason in the plan;
    a graph with nothing left for FP4 is refused in one line."""
    from onnx import numpy_helper

    from hrm_deploy.precision.calibrate import QuantPlan
    from hrm_deploy.precision.nvfp4 import write_nvfp4_qdq

    def graph(k: int, rank: int):
        shape = [2] * (rank - 1) + [k]
        w = numpy_helper.from_array(np.ones((k, 8), np.float32), "w")
        g = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [w],
        )
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])

    model = graph(32, 3)
    plan = QuantPlan(quantize=["mm"])
    write_nvfp4_qdq(model, plan, {"x": 1.0})
    assert plan.quantize == ["mm"] and any(n.op_type == DYNAMIC_QUANTIZE for n in model.graph.node)
    for k, rank, why in ((24, 3, "reduction size 24 is not a multiple of 16"), (32, 4, "this one is 4-D")):
        plan = QuantPlan(quantize=["mm"])
        with pytest.raises(ConfigError, match="NVFP4 can take none of this graph's MatMul/Gemm nodes"):
            write_nvfp4_qdq(graph(k, rank), plan, {"x": 1.0})
        assert why in plan.excluded["mm"]


def test_onnx_runtime_refuses_an_nvfp4_graph_in_one_line_and_runs_its_simulation(tiny_onnx, tmp_path):
    from pathlib import Path

    from hrm_deploy.backends.ort.runner import OrtRunner
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.errors import ArtifactError
    from hrm_deploy.precision.accuracy import onnx_accuracy
    from hrm_deploy.precision.nvfp4 import cpu_runnable

    result = _nvfp4(tiny_onnx.unrolled, tiny_onnx.data, tmp_path, quant=QuantConfig(samples=32))
    with pytest.raises(ArtifactError, match="is an NVFP4 graph and ONNX Runtime has no FP4 kernels"):
        OrtRunner(result.path).activate()
    before = sorted(tmp_path.iterdir())
    with cpu_runnable(result.path) as sim:
        assert Path(sim).parent != tmp_path  # nothing written beside the user's graph
        assert 0.0 <= onnx_accuracy(sim, load_examples(tiny_onnx.data, 32, split="test"))["exact_accuracy"] <= 1.0
    assert not Path(sim).exists() and sorted(tmp_path.iterdir()) == before
