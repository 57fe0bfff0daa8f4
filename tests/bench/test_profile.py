"""Per-layer profiles: layer names to model blocks, ORT / trtexec / TensorRT IProfiler / torch.profiler
readers, the host rows, the table, the side-by-side comparison, the chart and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hrm_deploy.bench.blocks import Block, Layer, Profile, classify, compare, table
from hrm_deploy.bench.profile import ProfileConfig, profile, read_ort_profile, read_trtexec_profile
from hrm_deploy.errors import ArtifactError, ConfigError

# (layer name as a backend reports it, op type, block)
NAMES = [
    # the export's node names (unrolled: stepN/ prefix; ORT's fusions keep the first node's name)
    ("embed//embed_tokens/Gather", "Gather", Block.EMBEDDING),
    ("embed//puzzle_emb/Gather", "Gather", Block.EMBEDDING),
    ("embed//Concat", "Concat", Block.EMBEDDING),
    ("step0//L_level/layers.0/self_attn/qkv_proj/MatMul", "MatMul", Block.QKV),
    ("step3//H_level/layers.1/self_attn/qkv_proj_1/MatMul", "MatMulIntegerToFloat", Block.QKV),
    ("step0//H_level/layers.0/self_attn_1/Reshape_1/fused_attention", "MultiHeadAttention", Block.ATTENTION),
    ("step0//L_level/layers.0/self_attn/Reshape_1/fused_q_rotary", "RotaryEmbedding", Block.ATTENTION),
    ("step0//L_level/layers.0/self_attn/Softmax", "Softmax", Block.ATTENTION),
    ("step0//H_level/layers.0/self_attn/o_proj_1/MatMul", "MatMul", Block.O_PROJ),
    ("step0//H_level/layers.0/mlp/gate_up_proj_1/MatMul", "MatMulNBits", Block.MLP),
    ("step0//H_level/layers.0/mlp_1/Mul_2/QuickGeluFusion/", "QuickGelu", Block.MLP),
    ("step0//H_level/layers.0/mlp/down_proj/MatMul", "MatMul", Block.MLP),
    ("step0//H_level/layers.0_1/Div/fused_rms_norm", "SimplifiedLayerNormalization", Block.NORM),
    ("step0//H_level/layers.0_1/Add", "Add", Block.NORM),
    ("step7//lm_head/MatMul", "MatMul", Block.LM_HEAD),
    ("step7//q_head/Gemm", "Gemm", Block.Q_HEAD),
    ("step0//L_level/Add", "Add", Block.CARRY),
    ("step2//Add_1", "Add", Block.CARRY),
    ("output/q_halt_logits", "Concat", Block.CARRY),
    ("Squeeze_token_49", "Squeeze", Block.CARRY),
    ("reset/Where_z_H", "Where", Block.CARRY),  # the step graph's carry reset
    ("step0//L_level/layers.0/self_attn/MatMul_1_output_0_q", "QuantizeLinear", Block.QUANTIZE),
    ("step0//H_level/Add_output_0_QuantizeLinear", "QuantizeLinear", Block.QUANTIZE),
    # TensorRT: a step engine's layers carry no stepN/ prefix; fused layers join their nodes
    ("/L_level/layers.0/self_attn/qkv_proj/MatMul + /L_level/layers.0/self_attn/Split", "", Block.QKV),
    ("{ForeignNode[/H_level/layers.0/mlp/gate_up_proj/MatMul.../H_level/layers.0/Mul_3]}", "", Block.MLP),
    ("Reformatting CopyNode for Input Tensor 0 to /lm_head/MatMul", "", Block.REFORMAT),
    # the reference: module paths (the core's prefix removed by the module scopes)
    ("L_level.layers.0.self_attn.qkv_proj", "aten::mm", Block.QKV),
    ("H_level.layers.1.self_attn", "aten::_scaled_dot_product_flash_attention_for_cpu", Block.ATTENTION),
    ("H_level.layers.1.mlp.down_proj", "aten::mm", Block.MLP),
    ("H_level.layers.1", "aten::pow", Block.NORM),
    ("L_level", "aten::add", Block.CARRY),
    ("embed_init", "aten::mul", Block.EMBEDDING),
    ("embed_tokens", "aten::embedding", Block.EMBEDDING),
    ("step", "aten::argmax", Block.CARRY),
    ("(runner)", "aten::to", Block.HOST_RUNNER),  # outside every module scope
    ("cpp_fused_add_mul_0", "cpp_fused_add_mul_0", Block.OTHER),
]


@pytest.mark.parametrize(("name", "op", "block"), NAMES, ids=[n for n, _, _ in NAMES])
def test_layer_names_map_to_model_blocks(name, op, block):
    assert classify(name, op) is block


def _ort_events(runs: int, per_run: list[tuple[str, str, int]], gap_us: int = 100) -> list[dict]:
    """A recorded ORT profile's shape: per run a model_run event and its nodes' kernel times (us)."""
    events: list[dict] = [{"cat": "Session", "name": "session_initialization", "ts": 0, "dur": 5000}]
    ts = 10_000
    for run in range(runs):
        busy = sum(d for _, _, d in per_run)
        events.append({"cat": "Session", "name": "model_run", "ts": ts, "dur": busy + gap_us})
        t = ts + gap_us // 2
        for name, op, dur in per_run:
            scaled = dur * (10 if run == 0 else 1)  # the warm-up run is slow: it must not count
            events.append(
                {"cat": "Node", "name": f"{name}_kernel_time", "ts": t, "dur": scaled, "args": {"op_name": op}}
            )
            events.append({"cat": "Node", "name": f"{name}_fence_before", "ts": t, "dur": 0, "args": {"op_name": op}})
            t += scaled
        ts += 1_000_000
    return events


NODES = [
    ("step0//L_level/layers.0/self_attn/qkv_proj/MatMul", "MatMul", 400),
    ("step0//L_level/layers.0/self_attn/Reshape_1/fused_attention", "MultiHeadAttention", 300),
    ("step0//L_level/layers.0/mlp/gate_up_proj/MatMul", "MatMul", 200),
    ("step0//L_level/layers.0/Div/fused_rms_norm", "SimplifiedLayerNormalization", 100),
]


def test_ort_profile_drops_warmup_runs_and_shows_the_runtime_host_gap(tmp_path):
    path = tmp_path / "ort.json"
    path.write_text(json.dumps(_ort_events(3, NODES)))  # 1 warm-up + 2 calls, one run each
    layers, model_run = read_ort_profile(path, calls=2, warmup=1)
    assert model_run == pytest.approx(2 * 1.1)  # (1000 us of kernels + 100 us of gap) x 2, in ms
    assert {layer.name: round(layer.ms, 6) for layer in layers}[NODES[0][0]] == pytest.approx(0.8)
    prof = Profile("g.onnx", "ort", "fp32", "ort", 1, 1, 2, layers, wall_ms=3.0, runtime_ms=model_run).as_dict()
    rows = {r["block"]: r for r in prof["rows"]}
    assert rows[Block.QKV.value]["ms_per_call"] == pytest.approx(0.4)
    assert rows[Block.HOST_RUNTIME.value]["ms_per_call"] == pytest.approx(0.1)  # model_run minus kernels
    assert rows[Block.HOST_RUNNER.value]["ms_per_call"] == pytest.approx(0.4)  # wall minus model_run
    assert sum(r["share"] for r in prof["rows"]) == pytest.approx(1.0)
    assert prof["ms_per_call"] == pytest.approx(1.5)
    with pytest.raises(ArtifactError, match="not a multiple"):
        read_ort_profile(path, calls=1, warmup=1)


def test_ort_profile_of_a_step_graph_counts_every_step_run_of_a_call(tmp_path):
    path = tmp_path / "ort.json"
    path.write_text(json.dumps(_ort_events(6, NODES)))  # 3 calls (1 warm-up) of 2 ACT steps each
    layers, model_run = read_ort_profile(path, calls=2, warmup=1)
    assert model_run == pytest.approx(4 * 1.1)
    prof = Profile("g.onnx", "ort", "fp32", "ort", 1, 2, 2, layers, runtime_ms=model_run).as_dict()
    assert prof["ms_per_step"] == pytest.approx(1.1)


# trtexec --exportProfile of a step engine: a count record, then one record per layer
TRTEXEC = [
    {"count": 50},
    {"name": "/L_level/layers.0/self_attn/qkv_proj/MatMul", "timeMs": 10.0, "averageMs": 0.2, "percentage": 40},
    {"name": "{ForeignNode[/L_level/layers.0/self_attn/Softmax]}", "timeMs": 5.0, "averageMs": 0.1, "percentage": 20},
    {"name": "/L_level/layers.0/mlp/down_proj/MatMul", "timeMs": 7.5, "averageMs": 0.15, "percentage": 30},
    {"name": "Reformatting CopyNode for Output Tensor 0 to /lm_head/MatMul", "timeMs": 2.5, "averageMs": 0.05},
]


def test_trtexec_profile_reads_as_a_profile(tmp_path):
    path = tmp_path / "trtexec.json"
    path.write_text(json.dumps(TRTEXEC))
    prof = read_trtexec_profile(path, batch=8).as_dict()
    rows = {r["block"]: r["ms_per_call"] for r in prof["rows"]}
    assert rows == pytest.approx(
        {Block.QKV.value: 0.2, Block.ATTENTION.value: 0.1, Block.MLP.value: 0.15, Block.REFORMAT.value: 0.05}
    )
    assert prof["calls"] == 50 and prof["batch"] == 8
    assert "| QKV projection | 40.0% |" in table(prof)
    path.write_text(json.dumps([{"name": "x"}]))
    with pytest.raises(ArtifactError, match="not a trtexec --exportProfile JSON"):
        read_trtexec_profile(path)
    path.write_text("{not json")
    with pytest.raises(ArtifactError, match="not a readable trtexec profile JSON"):
        read_trtexec_profile(path)


def test_comparison_lines_up_blocks_per_step():
    fp32 = Profile("a", "ort", "fp32", "ort", 1, 2, 1, [Layer("/x/qkv_proj/MatMul", "MatMul", 4.0)]).as_dict()
    int8 = Profile(
        "b",
        "ort",
        "int8",
        "ort",
        1,
        2,
        1,
        [Layer("/x/qkv_proj/MatMul", "MatMulIntegerToFloat", 1.0), Layer("q", "QuantizeLinear", 0.5)],
    ).as_dict()
    text = compare(fp32, int8)
    assert "| QKV projection | 2.000 | 0.500 | 4.00x |" in text
    assert "| quantize (Q/DQ) | 0.000 | 0.250 | - |" in text
    assert "| **total** | 2.000 | 0.750 | 2.67x |" in text


def test_tensorrt_iprofiler_through_the_runner(tmp_path, monkeypatch):
    """The runner hands a trt.IProfiler to its contexts (the fake TensorRT reports its layers per
    execute): warm-up reports are dropped, every step of every call counts."""
    import hrm_deploy.backends.tensorrt.runner as trt_runner
    from hrm_deploy.backends import open_runner
    from hrm_deploy.backends.tensorrt import fake_trt
    from hrm_deploy.backends.tensorrt.api import Backend
    from hrm_deploy.bench.profile import profile_trt

    monkeypatch.setattr(trt_runner, "load_backend", lambda name: Backend("tensorrt", fake_trt))
    # microseconds: the host loop's own wall time (numpy on the CPU) is far longer
    layers = {"/L_level/layers.0/self_attn/qkv_proj/MatMul": 2.5e-4, "/L_level/layers.0/mlp/down_proj/MatMul": 5e-4}
    path = tmp_path / "fake.engine"
    s = fake_trt.write_engine(path, precision="fp16", steps=3, layers=layers)
    feeds = {"inputs": np.ones((2, s["S"]), np.int32), "puzzle_identifiers": np.zeros(2, np.int32)}
    with pytest.raises(Exception, match="cuda_graph=False"):
        with open_runner(path, memory="host") as runner:
            runner.attach_profiler(lambda trt: trt.IProfiler())
    runner = open_runner(path, memory="host", cuda_graph=False)
    prof = profile_trt(runner, path, feeds, ProfileConfig(calls=2, warmup=1)).as_dict()
    rows = {r["block"]: r for r in prof["rows"]}
    assert rows[Block.QKV.value]["ms_per_call"] == pytest.approx(3 * 2.5e-4)  # 3 ACT steps per call
    assert rows[Block.MLP.value]["ms_per_step"] == pytest.approx(5e-4)
    assert rows[Block.QKV.value]["layers_per_call"] == 3
    assert Block.HOST_RUNNER.value in rows  # the wall time of the host loop beyond the fake's layers
    assert prof["precision"] == "fp16" and prof["steps"] == 3


def test_profile_config_and_empty_input_refused(tmp_path):
    with pytest.raises(ConfigError, match="calls must be"):
        ProfileConfig(calls=0)
    with pytest.raises(ConfigError, match="nothing to profile"):
        profile([], ProfileConfig(out_dir=str(tmp_path)))
    with pytest.raises(ArtifactError, match="missing.onnx not found"):
        profile([tmp_path / "missing.onnx"], ProfileConfig(out_dir=str(tmp_path)))


def test_profile_command_on_a_trtexec_json_writes_table_json_and_chart(tmp_path):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    path = tmp_path / "trtexec.json"
    path.write_text(json.dumps(TRTEXEC))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["profile", str(path), str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "| QKV projection |" in result.output and "side by side" in (out / "profile.md").read_text()
    written = json.loads((out / "profile.json").read_text())
    assert len(written["profiles"]) == 2 and "comparison" in written and "ISA" in written["environment"]["cpu"]
    assert (out / "profile.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_profile_ort_graph_and_reference_end_to_end(tiny_onnx, trained_tiny, tmp_path):
    """A real ORT session profile (unrolled and step graph) and the reference's torch.profiler
    with module scopes, through profile(): every block's time is accounted, none left as other."""
    out = tmp_path / "out"
    result = profile(
        [tiny_onnx.unrolled, tiny_onnx.step],
        ProfileConfig(data=tiny_onnx.data, batch=2, calls=2, out_dir=str(out)),
        reference=trained_tiny.checkpoint,
    )
    for prof in result["profiles"]:
        blocks = {r["block"] for r in prof["rows"]}
        assert {Block.QKV.value, Block.ATTENTION.value, Block.MLP.value, Block.EMBEDDING.value} <= blocks, prof
        other = sum(r["share"] for r in prof["rows"] if r["block"] == Block.OTHER.value)
        assert other < 0.02, [
            (prof["artifact"], prof.get("other_names"), r) for r in prof["rows"] if r["block"] == "other"
        ]
    assert result["profiles"][2]["artifact"] == str(trained_tiny.checkpoint)
    assert "module scopes" in result["profiles"][2]["profiler"]
    assert (
        Path(result["plot"]).is_file() and (out / "profile.md").read_text().count("| block |") == 4
    )  # 3 tables, 1 side by side


@pytest.mark.slow
def test_bench_profile_writes_the_profile_beside_the_report(tiny_onnx, trained_tiny, tmp_path):
    from hrm_deploy.bench.run import BenchConfig, bench

    out = tmp_path / "bench"
    timing = {"batches": (2,), "iters": 2, "warmup": 1, "accuracy_samples": 8}
    config = BenchConfig(
        data=tiny_onnx.data, reference=trained_tiny.checkpoint, out_dir=str(out), profile=True, **timing
    )
    report = bench([str(tiny_onnx.unrolled)], config, quiet=True)
    assert report["profile"] == str(out / "profile.json") and (out / "report.json").is_file()
    profiles = json.loads((out / "profile.json").read_text())["profiles"]
    assert [p["artifact"] for p in profiles] == [str(tiny_onnx.unrolled), str(trained_tiny.checkpoint)]
    assert profiles[0]["runner"] == "ort" and all(p["batch"] == 2 for p in profiles)


def test_a_compiled_engines_unseen_time_is_its_own_row():
    """AOTInductor's kernels emit no profiler events: the wall time beyond the seen operators is
    that compiled code, not the runner's host work."""
    seen = [Layer("aten::copy_", "aten::copy_", 1.0)]
    rows = Profile("m.pt2", "torch", "fp32", "torch", 1, 1, 1, seen, wall_ms=10.0, gap=Block.COMPILED).rows()
    assert {r["block"]: r["ms_per_call"] for r in rows} == {Block.OTHER.value: 1.0, Block.COMPILED.value: 9.0}


def test_top_level_modules_of_the_core_have_their_block():
    """The reference's scopes of the core's own children carry no path in front of them (``lm_head``,
    ``q_head``, ``puzzle_emb``): they are the heads and the embedding, never "other"."""
    from hrm_deploy.bench.blocks import Block, classify

    assert classify("lm_head") == Block.LM_HEAD and classify("q_head") == Block.Q_HEAD
    assert classify("puzzle_emb") == Block.EMBEDDING and classify("embed_tokens") == Block.EMBEDDING


def test_a_loop_node_is_not_counted_beside_its_body() -> None:
    """ORT profiles a loop graph's body node by node and the ``Loop`` node with their total: the
    container is left out, so a loop graph's blocks add up to the call (once)."""
    from hrm_deploy.bench.blocks import fold

    layers = fold([("loop/Loop", "Loop", 10.0), ("loop/step/MatMul", "MatMul", 6.0), ("loop/step/Add", "Add", 3.0)])
    assert sorted((layer.op, layer.ms) for layer in layers) == [("Add", 3.0), ("MatMul", 6.0)]


def test_profile_and_bench_share_helpers_without_importing_each_other() -> None:
    """No circle between the two measurements: what both need lives in bench/common.py."""
    import ast

    import hrm_deploy.bench.common as common
    import hrm_deploy.bench.profile as profile_module

    for module, forbidden in ((profile_module, "hrm_deploy.bench.run"), (common, "hrm_deploy.bench")):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not {m for m in imported if m == forbidden or m.startswith("hrm_deploy.bench.run")}, module.__name__
