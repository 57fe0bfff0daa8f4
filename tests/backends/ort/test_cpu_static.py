"""Static INT8 of the cpu target: answers independent of the batch (dynamic's are not), the
accuracy rule with its FP32 fallback and refusal, the calibration defaults, refused options."""

import json

import numpy as np
import pytest

from hrm_deploy.backends import open_runner
from hrm_deploy.backends.ort.builder.cpu import CpuBuildConfig, build_cpu
from hrm_deploy.backends.ort.builder.options import CpuOptions
from hrm_deploy.backends.tensorrt.builder.options import TensorRTOptions
from hrm_deploy.data.examples import load_examples
from hrm_deploy.engines.build import EngineConfig
from hrm_deploy.errors import ConfigError
from hrm_deploy.runtime.infer import predict
from tests.conftest import all_weights, mlp_weights, quantized_weights


def _alone_and_batched(path, examples):
    runner = open_runner(path, threads=1)
    runner.activate()
    try:
        return predict(runner, examples, batch=1), predict(runner, examples, batch=64)
    finally:
        runner.close()


@pytest.mark.slow
def test_static_int8_answers_do_not_depend_on_the_batch_and_dynamic_ones_do(small_onnx, tmp_path):
    """300 held-out puzzles on the bundled ACT model, each run alone and in batches of 64: static
    INT8 gives every puzzle the same bytes both ways; dynamic INT8 (one activation scale per call)
    answers some differently, so this comparison can fail."""
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.train.presets import preset

    data = tmp_path / "data"
    spec = preset("sudoku-small")["data"]
    generate_sudoku(SudokuSpec(**{**spec, "train": 128, "test": 300, "augment": 0, "seed": 777}), str(data))
    fp32 = small_onnx
    static = build_cpu(
        fp32,
        CpuBuildConfig("int8", threads=1, calib_data=str(data), cache_dir=str(tmp_path / "calib")),
        tmp_path / "s.int8.cpu.ort.onnx",
        quiet=True,
    )
    ops = static.build["op_types"]
    accuracy = json.loads(static.manifest.read_text())["recipe"]["accuracy"]
    print(json.dumps(accuracy))
    chosen = json.loads(static.manifest.read_text())["recipe"]["activations"]  # by this CPU's ISA (builder/isa.py)
    assert chosen["activations"] in ("uint8", "int8") and chosen["chosen_by"].startswith("this CPU's ISA")
    assert ops["com.microsoft.MatMulIntegerToFloat"] == static.build["quantized_nodes"] > 96
    assert static.build["quantized_nodes"] + len(accuracy["kept_float_nodes"]) == 192  # the rest stayed FP32
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


@pytest.mark.slow
def test_accuracy_budget_keeps_the_most_sensitive_layers_fp32(tiny_onnx, tmp_path, harm_quantized):
    """Each quantized L-level MLP weight answers 5 % of the puzzles wrong: the fallback keeps both
    FP32 (one alone still loses 5 points), the manifest says which by weight and by node, and the
    published graph is that mix: those weights read as float, every other one quantized."""
    harm_quantized(0.05)
    mlp = mlp_weights(tiny_onnx.unrolled)
    config = CpuBuildConfig("int8", threads=1, calib_data=tiny_onnx.data, cache_dir=str(tmp_path / "calib"))
    built = build_cpu(tiny_onnx.unrolled, config, tmp_path / "t.int8.cpu.ort.onnx", quiet=True)
    record = json.loads(built.manifest.read_text())["recipe"]["accuracy"]
    assert record["all_quantized"]["loss_points"] > 1.0 and record["measured"]["loss_points"] <= 1.0
    assert sorted(k["weight"] for k in record["kept_float"]) == mlp
    assert all("L_level" in name and "mlp" in name for name in record["kept_float_nodes"])
    assert quantized_weights(built.path, mlp) == 0  # the engine is the mix the manifest describes
    assert record["fallback"]["screens"] <= (len(record["sensitivity"]) - 1).bit_length()  # bisection
    others = [w for w in all_weights(tiny_onnx.unrolled) if w not in mlp]
    assert 0 < quantized_weights(built.path, others) <= len(others)  # the rest stayed INT8 (heads excluded)


@pytest.mark.slow
def test_no_mix_within_the_budget_is_refused_with_the_numbers(tiny_onnx, tmp_path, harm_quantized):
    harm_quantized(0.5, every_weight=True)  # any quantized weight loses half the puzzles
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
        ConfigError, match=r"<= 2 points lost.*even with \d+ layers kept float: exact .* all quantized: exact"
    ):
        build_cpu(tiny_onnx.unrolled, config, out, quiet=True)
    assert not out.exists() and not list(tmp_path.glob("*.manifest.json"))
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

    from hrm_deploy.errors import DataError
    from hrm_deploy.precision.conductor import make_holdout

    test = load_examples(tiny_onnx.data, 40, split="test")
    npz = tmp_path / "inputs.npz"
    np.savez(npz, inputs=test.inputs, puzzle_identifiers=test.puzzle_identifiers, labels=test.labels)
    # what the holdout reads of the job
    job = SimpleNamespace(examples=load_examples(npz, 30), share_holdout=False, source=tiny_onnx.unrolled, meta={})
    rest = make_holdout(job, str(npz), 128, None).pool  # type: ignore[arg-type]
    assert len(rest) == 10 and not {r.tobytes() for r in rest.inputs} & {r.tobytes() for r in job.examples.inputs}
    with pytest.raises(DataError, match="calibration used every example"):
        make_holdout(SimpleNamespace(**{**vars(job), "examples": load_examples(npz, 40)}), str(npz), 128, None)  # type: ignore[arg-type]


def test_the_holdout_is_sized_by_the_models_cost():
    """Small models are measured on many puzzles (1 point of exact accuracy must be visible),
    a Sudoku-size one on the minimum that keeps its build short."""
    import dataclasses

    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.precision.accuracy import HOLDOUT_SAMPLES, MIN_HOLDOUT, holdout_size
    from hrm_deploy.train.presets import preset

    def size(name, steps):
        model = {**preset(name)["model"], "forward_dtype": "float32"}
        config = HRMConfig(seq_len=81, vocab_size=11, num_puzzle_identifiers=1, **model)
        return holdout_size({"config": dataclasses.asdict(config), "steps": steps}, HOLDOUT_SAMPLES)

    assert size("sudoku-small", 8) >= 500
    assert size("sudoku", 16) == MIN_HOLDOUT
