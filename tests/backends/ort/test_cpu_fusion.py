"""The cpu target's fusions (engines/cpu_fusion.py): attention with RoPE and RMSNorm become ORT's
fused CPU kernels, the answers stay, every fused block is checked, and what does not match the
pattern is left as it was."""

import json

import numpy as np
import onnx
import pytest

from hrm_deploy.backends import open_runner
from hrm_deploy.backends.ort.builder import cpu as cpu_module
from hrm_deploy.backends.ort.builder.cpu import CpuBuildConfig, build_cpu
from hrm_deploy.backends.ort.builder.fusion import check_rewrites, fuse_for_cpu
from hrm_deploy.data.examples import load_examples
from hrm_deploy.errors import InternalError
from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
from hrm_deploy.metrics import accuracy
from hrm_deploy.runtime.infer import predict

FUSED_OPS = ("com.microsoft.MultiHeadAttention", "com.microsoft.RotaryEmbedding", "SimplifiedLayerNormalization")


def _build(onnx_path, folder, precision, fuse, data=None):
    """INT8: the static recipe, calibrated on ``data`` (cache in ``folder``; the accuracy check
    is test_cpu_static.py's)."""
    name = f"m.{precision}{'' if fuse else '-unfused'}.cpu.ort.onnx"
    static = {"calib_data": data, "cache_dir": str(folder / "calib"), "check_accuracy": False}
    config = CpuBuildConfig(precision, threads=1, fuse=fuse, **(static if precision == "int8" else {}))
    return build_cpu(onnx_path, config, folder / name, quiet=True)


def _predictions(path, examples):
    runner = open_runner(path, threads=1)
    runner.activate()
    try:
        return predict(runner, examples)
    finally:
        runner.close()


@pytest.fixture(scope="module")
def small_export(small_onnx, tmp_path_factory):
    return tmp_path_factory.mktemp("fusion"), small_onnx


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_fused_bundled_model_gives_the_same_answers_with_far_fewer_nodes(small_export, trained_small, precision):
    folder, fp32 = small_export
    data = trained_small.data
    fused, plain = _build(fp32, folder, precision, True, data), _build(fp32, folder, precision, False, data)
    report = fused.build["fusions"]
    # sudoku-small: 8 ACT steps x (2 H + 2x2 L) = 48 attention blocks, two RMSNorms each.
    assert (report["attention"], report["rotary_embedding"], report["rms_norm"]) == (48, 96, 96)
    assert report["not_matched"] == {} and report["checked_max_error"] < 1e-5
    assert report["checked_blocks"] == 48 + 96  # all of them: the bundled model's taps are a few MB
    ops = fused.build["op_types"]
    assert all(ops.get(op) for op in FUSED_OPS), ops
    assert not any(k in ops for k in ("Softmax", "Transpose", "Sqrt", "ReduceMean", "Neg"))
    assert fused.build["onnx_nodes_out"] < 0.45 * plain.build["onnx_nodes_out"]
    assert "fusions" not in plain.build
    manifest = json.loads(fused.manifest.read_text())
    assert manifest["build"]["fusions"]["attention"] == 48
    examples = load_examples(trained_small.data, None, split="test")
    got, want = _predictions(fused.path, examples), _predictions(plain.path, examples)
    if precision == "fp32":
        np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max())
    # INT8 quantizes each call's activations to the call's range, so a rounding difference may
    # move a value to the next bin and the recurrence carries it on: a few cells of 8,100 differ.
    agree = (got.argmax(-1) == want.argmax(-1)).mean()
    assert agree >= (0.9999 if precision == "fp32" else 0.995), agree
    exact = [100 * accuracy(p, examples.labels)["exact_accuracy"] for p in (got, want)]
    assert abs(exact[0] - exact[1]) <= (0.0 if precision == "fp32" else 2.0), exact  # 100 puzzles


@pytest.mark.slow
def test_fused_step_graph_matches_on_every_step(tiny_onnx, trained_tiny, tmp_path):
    fused, plain = _build(tiny_onnx.step, tmp_path, "fp32", True), _build(tiny_onnx.step, tmp_path, "fp32", False)
    report = fused.build["fusions"]
    assert report["attention"] > 0 and report["not_matched"] == {} and report["rms_norm"] == 2 * report["attention"]
    feeds = load_examples(trained_tiny.data, 8, split="test").feeds(0, 8)
    outs = []
    for built in (fused, plain):
        runner = open_runner(built.path, threads=1)
        runner.activate()
        outs.append(runner.infer(feeds))  # the step graph driven through every ACT step
        runner.close()
    for key in ("logits", "q_halt_logits", "q_continue_logits"):
        np.testing.assert_allclose(outs[0][key], outs[1][key], atol=1e-3, rtol=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["learned", "random-weights"])
def test_models_without_rope_and_chaotic_random_weights_are_fused_and_checked(tiny_config, tmp_path, variant):
    """Learned positions: attention without the rotary part. Random weights: the recurrence is
    chaotic, so whole-graph outputs of fused and unfused graphs part ways; the per-block check
    feeds each fused block the unfused graph's own input and still holds it to 1e-4."""
    import dataclasses

    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.model.hrm import build_model

    config = dataclasses.replace(tiny_config, pos_encodings="learned") if variant == "learned" else tiny_config
    ckpt = save_checkpoint(tmp_path / "m.pt", build_model(config, seed=3))
    fp32 = export_onnx(str(ckpt), tmp_path / "m.onnx", ExportConfig(parity=False), quiet=True).path
    report = _build(fp32, tmp_path, "fp32", True).build["fusions"]
    assert report["attention"] == 4 * (2 * 2 + 2 * 2 * 2) and report["rms_norm"] == 2 * report["attention"]
    assert report["rotary_embedding"] == (0 if variant == "learned" else 2 * report["attention"])
    assert report["checked_max_error"] < 1e-5


def _optimized(small_export, tmp_path):
    folder, fp32 = small_export
    path = tmp_path / "opt.onnx"
    cpu_module.optimize_offline(str(fp32), str(path), 1)
    return onnx.load(str(path))


def _feed(seq_len=81):
    return {"inputs": np.full((1, seq_len), 1, np.int32), "puzzle_identifiers": np.zeros(1, np.int32)}


@pytest.mark.slow
def test_the_block_check_catches_a_wrong_fusion(small_export, tmp_path):
    unfused = _optimized(small_export, tmp_path)
    fused = onnx.ModelProto()
    fused.CopyFrom(unfused)
    _, rewrites = fuse_for_cpu(fused, 64)
    assert check_rewrites(unfused, fused, rewrites, _feed(), 1) == (pytest.approx(0, abs=1e-5), 144)
    attention = next(r for r in rewrites if r.kind == "attention").nodes[-1]
    scale = next(a for a in attention.attribute if a.name == "scale")
    scale.f *= 1.5  # a wrong softmax temperature in one block of 48
    assert check_rewrites(unfused, fused, rewrites, _feed(), 1)[0] > 1e-2
    # Over the memory budget an evenly spaced sample of each kind is checked, ends included.
    error, checked = check_rewrites(unfused, fused, rewrites, _feed(), 1, tensor_bytes=2**20, budget_bytes=96 * 2**20)
    # 48 attention x 4 MiB + 96 norms x 2 MiB = 384 MiB: a quarter of each kind, the broken first block included
    assert checked == 12 + 24 and error > 1e-2


@pytest.mark.slow
def test_a_failed_block_check_stops_the_build_without_debris(small_export, tmp_path, monkeypatch):
    folder, fp32 = small_export
    monkeypatch.setattr("hrm_deploy.backends.ort.builder.fusion.check_rewrites", lambda *a, **k: 0.5)
    out = tmp_path / "engines" / "m.fp32.cpu.ort.onnx"
    with pytest.raises(InternalError, match="--no-fuse"):
        build_cpu(fp32, CpuBuildConfig("fp32", threads=1), out, quiet=True)
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_blocks_that_differ_from_the_pattern_are_left_alone(small_export, tmp_path):
    """A RoPE whose cos table does not repeat its halves is not rotate-half RoPE: not fused."""
    model = _optimized(small_export, tmp_path)
    by_name = {t.name: t for t in model.graph.initializer}
    cos_mul = next(
        n
        for n in model.graph.node
        if n.op_type == "Mul"
        and any(i in by_name and onnx.numpy_helper.to_array(by_name[i]).ndim == 3 for i in n.input)
    )
    name = next(i for i in cos_mul.input if i in by_name)
    table = onnx.numpy_helper.to_array(by_name[name]).copy()
    table[..., -1] += 0.5
    # export shares one table among all blocks: this one block gets its own, changed copy
    model.graph.initializer.append(onnx.numpy_helper.from_array(table, name + ".changed"))
    cos_mul.input[list(cos_mul.input).index(name)] = name + ".changed"
    report, rewrites = fuse_for_cpu(model, 64)
    assert 0 < report.skipped["attention"] < 48 and report.attention == 48 - report.skipped["attention"]
    assert report.rms_norm == 96


@pytest.mark.slow
def test_fp16_and_no_fuse_builds_are_not_fused(small_export):
    folder, fp32 = small_export
    for config in (CpuBuildConfig("fp16", threads=1), CpuBuildConfig("fp32", threads=1, fuse=False)):
        built = build_cpu(fp32, config, folder / f"nf.{config.precision}.cpu.ort.onnx", quiet=True)
        assert "fusions" not in built.build
        assert not any(op in built.build["op_types"] for op in FUSED_OPS)


def test_cli_no_fuse(tiny_onnx, tmp_path):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    out = tmp_path / "m.fp32.cpu.ort.onnx"
    args = ["build-engine", str(tiny_onnx.unrolled), "--target", "cpu", "--fp32", "-o", str(out), "-q"]
    result = CliRunner().invoke(app, [*args, "--no-fuse"])
    assert result.exit_code == 0, result.output
    assert "fusions" not in json.loads(out.with_name(out.name + ".manifest.json").read_text())["build"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(out.with_name(out.name + ".manifest.json").read_text())["build"]["fusions"]["attention"] > 0
