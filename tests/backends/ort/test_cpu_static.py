"""Static INT8 of the cpu target: answers independent of the batch (dynamic's are not), the
accuracy budget with its FP32 fallback and refusal, the calibration defaults, refused options."""

import json

import numpy as np
import pytest

from hrm_deploy.backends import open_runner
from hrm_deploy.backends.ort.builder.cpu import CpuBuildConfig, build_cpu
from hrm_deploy.backends.ort.builder.options import CpuOptions
from hrm_deploy.backends.ort.builder.static import Holdout, Quality
from hrm_deploy.backends.tensorrt.builder.options import TensorRTOptions
from hrm_deploy.data.examples import load_examples
from hrm_deploy.engines.build import EngineConfig
from hrm_deploy.errors import ConfigError
from hrm_deploy.runtime.infer import predict


def _alone_and_batched(path, examples):
    runner = open_runner(path, threads=1)
    runner.activate()
    try:
        return predict(runner, examples, batch=1), predict(runner, examples, batch=64)
    finally:
        runner.close()


@pytest.mark.slow
def test_static_int8_answers_do_not_depend_on_the_batch_and_dynamic_ones_do(trained_small, tmp_path):
    """300 held-out puzzles on the bundled ACT model, each run alone and in batches of 64: static
    INT8 gives every puzzle the same bytes both ways; dynamic INT8 (one activation scale per call)
    answers some differently, so this comparison can fail."""
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.train.presets import preset

    data = tmp_path / "data"
    spec = preset("sudoku-small")["data"]
    generate_sudoku(SudokuSpec(**{**spec, "train": 128, "test": 300, "augment": 0, "seed": 777}), str(data))
    fp32 = export_onnx(trained_small.checkpoint, tmp_path / "small.onnx", ExportConfig(parity=False), quiet=True).path
    static = build_cpu(
        fp32,
        CpuBuildConfig("int8", threads=1, calib_data=str(data), cache_dir=str(tmp_path / "calib")),
        tmp_path / "s.int8.cpu.ort.onnx",
        quiet=True,
    )
    ops = static.build["op_types"]
    accuracy = json.loads(static.manifest.read_text())["recipe"]["accuracy"]
    print(json.dumps(accuracy))
    chosen = json.loads(static.manifest.read_text())["recipe"]["activations"]  # measured here (builder/isa.py)
    assert chosen["activations"] in ("uint8", "int8") and chosen["u8s8_ms"] > 0 and chosen["s8s8_ms"] > 0
    assert ops["com.microsoft.MatMulIntegerToFloat"] == static.build["quantized_nodes"] > 96
    assert static.build["quantized_nodes"] + accuracy.get("kept_float_nodes", 0) == 192  # the rest stayed FP32
    assert ops["com.microsoft.MultiHeadAttention"] == 48 and "DequantizeLinear" not in ops  # fusions kept
    assert accuracy["measured"]["loss_points"] <= 1.0 and accuracy["measured"]["argmax_agreement_pct"] >= 98.0
    examples = load_examples(str(data), None, split="test")
    assert len(examples) == 300
    alone, batched = _alone_and_batched(static.path, examples)
    assert int((alone.argmax(-1) != batched.argmax(-1)).any(-1).sum()) == 0
    assert np.array_equal(alone, batched)  # bit-identical logits, not only answers
    dynamic = build_cpu(
        fp32, CpuBuildConfig("int8", threads=1, int8_recipe="dynamic"), tmp_path / "d.int8.cpu.ort.onnx", quiet=True
    )
    alone, batched = _alone_and_batched(dynamic.path, examples)
    assert int((alone.argmax(-1) != batched.argmax(-1)).any(-1).sum()) > 0


def _float_weights_lost(path, weights):
    """How many of ``weights`` (FP32 initializer names) no node reads as float any more (quantized)."""
    import onnx

    read = {name for node in onnx.load(str(path)).graph.node for name in node.input}
    return sum(w not in read for w in weights)


def _mlp_weights(fp32):
    import onnx

    model = onnx.load(str(fp32))
    return sorted(
        {n.input[1] for n in model.graph.node if n.op_type == "MatMul" and "L_level" in n.name and "mlp" in n.name}
    )


@pytest.mark.slow
def test_accuracy_budget_keeps_the_most_sensitive_layers_fp32(tiny_onnx, tmp_path, monkeypatch):
    """A measurement that punishes quantized L-level MLP weights (1.5 points of argmax agreement
    each): the fallback keeps the fewest of them FP32 that bring agreement to >= 98 % (one of
    two), and the manifest says which and what was measured."""
    mlp = _mlp_weights(tiny_onnx.unrolled)
    assert len(mlp) == 2

    def measure(self, path):
        return Quality(93.0, 93.0, 100.0 - 1.5 * _float_weights_lost(path, mlp), len(self.examples))

    import hrm_deploy.precision.sensitivity as sensitivity

    def signal(qdq, fp32, groups, examples, source, meta):  # the MLP weights' own error is the largest
        return {w: 1.5 if w in mlp else 0.0 for w in groups}

    monkeypatch.setattr(Holdout, "measure", measure)
    monkeypatch.setattr(sensitivity, "local_errors", signal)
    config = CpuBuildConfig("int8", threads=1, calib_data=tiny_onnx.data, cache_dir=str(tmp_path / "calib"))
    built = build_cpu(tiny_onnx.unrolled, config, tmp_path / "t.int8.cpu.ort.onnx", quiet=True)
    record = json.loads(built.manifest.read_text())["recipe"]["accuracy"]
    assert record["all_int8"]["argmax_agreement_pct"] == 97.0
    assert len(record["kept_float"]) == 1 and record["kept_float"][0]["weight"] in mlp
    assert "L_level" in record["kept_float"][0]["node"] and record["kept_float_nodes"] == 1
    assert record["measured"]["argmax_agreement_pct"] == 98.5
    assert sorted(s["sensitivity"] for s in record["sensitivity"]) == [0.0] * (len(record["sensitivity"]) - 2) + [
        1.5,
        1.5,
    ]
    assert _float_weights_lost(built.path, mlp) == 1  # the engine is the mix the manifest describes
    weights, search = len(record["sensitivity"]), record["fallback"]
    assert search["probes"] == search["bisection_probes"]  # ranking is one pass, not a probe per weight
    assert 1 <= search["bisection_probes"] <= (weights - 1).bit_length()  # bisection, not one per weight kept
    assert search["limits"]["stopped"] is None and search["limits"]["max_probes"] >= search["probes"]


@pytest.mark.slow
def test_no_mix_within_the_budget_is_refused_with_the_numbers(tiny_onnx, tmp_path, monkeypatch):
    monkeypatch.setattr(Holdout, "measure", lambda self, path: Quality(93.0, 80.0, 90.0, len(self.examples)))
    config = CpuBuildConfig(
        "int8",
        threads=1,
        calib_data=tiny_onnx.data,
        calib_method="percentile",
        calib_samples=32,
        accuracy_budget=2.0,
        cache_dir=str(tmp_path / "calib"),
    )
    out = tmp_path / "t.int8.cpu.ort.onnx"
    with pytest.raises(
        ConfigError,
        match=r"<= 2 points lost.*exact 80.00 % vs FP32 93.00 % \(13.00 points lost: 0 puzzles lost, 0 gained\), "
        r"argmax agreement 90.00 %.*--accuracy-budget",
    ) as info:
        build_cpu(tiny_onnx.unrolled, config, out, quiet=True)
    assert "\n" not in str(info.value) and not out.exists()
    assert any("percentile" in p.name and "k32" in p.name for p in (tmp_path / "calib").iterdir())


def test_calibration_data_defaults_to_the_checkpoints_provenance(tiny_onnx, tmp_path, monkeypatch, capsys, cli_logs):
    from hrm_deploy import provenance

    asked = []

    def default_data(artifact, flag, splits=None):
        asked.append((str(artifact), flag, splits))
        return provenance.DataChoice(tiny_onnx.data, f"no {flag} given: using the checkpoint's own dataset")

    monkeypatch.setattr(provenance, "default_data", default_data)
    config = CpuBuildConfig(
        "int8", threads=1, calib_samples=16, cache_dir=str(tmp_path / "calib"), check_accuracy=False
    )
    built = build_cpu(tiny_onnx.unrolled, config, tmp_path / "t.int8.cpu.ort.onnx")
    recipe = json.loads(built.manifest.read_text())["recipe"]
    assert (
        asked == [(str(tiny_onnx.unrolled), "--calib-data", {"train": 16})]
        and "no --calib-data given" in capsys.readouterr().err
    )
    assert recipe["calibration"]["data"] == tiny_onnx.data and recipe["calibration"]["samples"] == 16
    assert recipe["accuracy"] == {"checked": False, "why": "--no-accuracy-check: not measured against FP32"}


def test_options_the_cpu_target_cannot_honour_are_refused():
    """Refused once, by the build stage's options (EngineConfig), before any builder runs."""
    with pytest.raises(ConfigError, match="--backend torch does not build for --target cpu"):
        EngineConfig("fp32", target="cpu", backend="torch")
    with pytest.raises(ConfigError, match="--max-batch, --opt-level: TensorRT build options"):
        EngineConfig("int8", target="cpu", max_batch=8, options=TensorRTOptions(optimization_level=2))
    with pytest.raises(ConfigError, match="--timing-cache: TensorRT build option"):
        EngineConfig("fp32", target="cpu", options=TensorRTOptions(timing_cache="t.cache"))
    with pytest.raises(ConfigError, match="add --int8"):
        EngineConfig("fp32", target="cpu", options=CpuOptions(int8_recipe="static"))
    with pytest.raises(ConfigError, match="--calib-data, --accuracy-budget: only the static INT8 recipe"):
        CpuBuildConfig("int8", int8_recipe="dynamic", calib_data="d", accuracy_budget=1.0)
    with pytest.raises(ConfigError, match="--calib-method: only the static"):
        CpuBuildConfig("fp32", calib_method="entropy")
    with pytest.raises(ConfigError, match="--accuracy-budget is in exact-accuracy points"):
        CpuBuildConfig("int8", accuracy_budget=-1.0)


def test_cli_refuses_cpu_options_elsewhere_and_the_backend_on_cpu(tiny_onnx):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    runner = CliRunner()
    for args, message in (
        (["--fp16", "--cpu-int8", "dynamic"], "--cpu-int8 dynamic is an option of --target cpu"),
        (["--fp16", "--no-fuse"], "--no-fuse is an option of --target cpu"),
        (["--target", "cpu", "--backend", "tensorrt"], "--backend tensorrt does not build for --target cpu"),
        (["--target", "cpu", "--max-batch", "8"], "--max-batch: TensorRT build option"),
    ):
        result = runner.invoke(app, ["build-engine", str(tiny_onnx.unrolled), *args])
        assert result.exit_code != 0 and message in result.output, result.output


def test_an_npz_holdout_is_the_examples_calibration_did_not_use(tiny_onnx, tmp_path):
    from types import SimpleNamespace

    from hrm_deploy.backends.ort.builder.static import holdout
    from hrm_deploy.errors import DataError

    test = load_examples(tiny_onnx.data, 40, split="test")
    npz = tmp_path / "inputs.npz"
    np.savez(npz, inputs=test.inputs, puzzle_identifiers=test.puzzle_identifiers, labels=test.labels)
    # what the holdout reads of the job
    calib = SimpleNamespace(examples=load_examples(npz, 30), share_holdout=False, source=tiny_onnx.unrolled, meta={})
    config = SimpleNamespace(holdout_samples=128, threads=1)
    rest = holdout(tiny_onnx.unrolled, calib, {}, config)[0].examples
    assert len(rest) == 10 and not {r.tobytes() for r in rest.inputs} & {r.tobytes() for r in calib.examples.inputs}
    with pytest.raises(DataError, match="calibration used every example"):
        holdout(tiny_onnx.unrolled, SimpleNamespace(**{**vars(calib), "examples": load_examples(npz, 40)}), {}, config)


def test_the_holdout_is_sized_by_the_models_cost():
    """Small models are measured on many puzzles (1 point of exact accuracy must be visible),
    a Sudoku-size one on the minimum that keeps its build short."""
    import dataclasses

    from hrm_deploy.backends.ort.builder.static import HOLDOUT_SAMPLES, MIN_HOLDOUT, holdout_size
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.train.presets import preset

    def size(name, steps):
        model = {**preset(name)["model"], "forward_dtype": "float32"}
        config = HRMConfig(seq_len=81, vocab_size=11, num_puzzle_identifiers=1, **model)
        return holdout_size({"config": dataclasses.asdict(config), "steps": steps}, HOLDOUT_SAMPLES)

    assert size("sudoku-small", 8) >= 500
    assert size("sudoku", 16) == MIN_HOLDOUT
