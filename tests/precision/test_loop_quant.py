"""Quantized loop graphs: the Loop's body lifted as a model of its own and seated back, calibrated
inside the graph over every step the loop runs, its Q/DQ (and the cpu target's integer GEMMs and
fusions) placed in the body. Bundled sudoku-small (8 ACT steps), halting off and q."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from hrm_deploy.backends.ort.builder.options import CpuOptions
from hrm_deploy.backends.tensorrt.builder.options import TensorRTOptions
from hrm_deploy.export.loop_body import find_loop, lift_body, loop_body, seat_body
from hrm_deploy.export.metadata import graph_metadata
from hrm_deploy.onnx_runtime import Optimization, ort_session
from hrm_deploy.precision.calibrate import QuantConfig

pytestmark = pytest.mark.slow  # each test exports or quantizes the bundled model (seconds)

CALIB = 32


@pytest.fixture(scope="module")
def small(trained_small, tmp_path_factory):
    """The bundled sudoku-small as loop graphs (halting off and q) and the step graph of the same
    segment (parity is held by the export tests), and the calibration examples."""
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx

    folder = tmp_path_factory.mktemp("loopq")
    paths = {}
    for name, mode, halt in (("off", "loop", "off"), ("q", "loop", "q"), ("step", "step", "off")):
        config = ExportConfig(mode=mode, halt=halt, parity=False)
        paths[name] = export_onnx(trained_small.checkpoint, folder / f"s.{name}.onnx", config, quiet=True).path
    examples = load_examples(trained_small.data, CALIB)
    return SimpleNamespace(**paths, data=trained_small.data, examples=examples, folder=folder)


def _job(path: Path, examples, cache: Path):
    from hrm_deploy.precision.job import calibrate_job, new_job

    model = onnx.load(str(path))
    job = new_job(path, model, graph_metadata(model), examples, QuantConfig(samples=CALIB), cache, path.name)
    calibrate_job(job)
    return job


@pytest.fixture(scope="module")
def jobs(small):
    """The calibrated quantization jobs of the three graphs (each calibrated once, for every test)."""
    return {name: _job(getattr(small, name), small.examples, small.folder / "calib") for name in ("off", "q", "step")}


def _ranges(job) -> dict[str, float]:
    data = json.loads(job.cache.read_text())["data"]
    return {name: float(entry["highest"]["data"]) for name, entry in data.items()}


def test_lift_then_seat_with_no_edit_is_bit_for_bit(small) -> None:
    model = onnx.load(str(small.q))
    lifted = lift_body(model)
    names = [i.name for i in lifted.graph.input]
    assert names[:2] == ["loop/iter", "loop/cond"] and "embed/x" in names  # the outer value the body reads
    made = set(names) | {o for n in lifted.graph.node for o in n.output} | {t.name for t in lifted.graph.initializer}
    assert {i for n in lifted.graph.node for i in n.input} <= made  # every weight and constant it reads is in it
    seated = seat_body(model, lifted)
    feeds = small.examples.feeds(0, 8)
    want = ort_session(model.SerializeToString()).run(None, feeds)
    got = ort_session(seated.SerializeToString()).run(None, feeds)
    for a, b in zip(want, got, strict=True):
        assert np.array_equal(a, b, equal_nan=True)


def test_loop_calibration_equals_the_step_graphs_over_every_step(jobs) -> None:
    """Halting off: the body's ranges measured inside the loop (scanned out, max over the steps) are
    those of the host loop driving the step graph through all 8 steps, tensor by tensor."""
    loop, step = jobs["off"], jobs["step"]
    assert all(name.startswith("loop/step/") for name in loop.plan.quantize)  # the body's MatMuls
    got, want = _ranges(loop), _ranges(step)
    assert {name.removeprefix("loop/") for name in got} == set(want) and len(want) > 10
    for name, peak in got.items():
        assert peak == pytest.approx(want[name.removeprefix("loop/")], rel=1e-6), name


def test_int8_loop_graph_has_its_qdq_in_the_body_and_answers_as_the_int8_step_graph(small, jobs, tmp_path) -> None:
    """The INT8 loop graph is the INT8 step graph's arithmetic inside the loop: halting off, equal
    logits and q logits; halting q, every row halts at the step the host loop over the INT8 step graph
    halts it (the same rule on the same q logits)."""
    from hrm_deploy.export.loop import LoopHalt, host_loop
    from hrm_deploy.precision.int8 import quantize_int8

    for name in ("off", "q", "step"):
        quantize_int8(jobs[name], tmp_path / f"{name}.int8.onnx")
    model = onnx.load(str(tmp_path / "off.int8.onnx"))
    onnx.checker.check_model(model)
    assert not any(n.op_type == "QuantizeLinear" for n in model.graph.node)
    body = loop_body(model)
    assert sum(n.op_type == "QuantizeLinear" for n in body.node) == len(jobs["off"].plan.quantize)
    outer = {t.name for t in model.graph.initializer}
    assert any(name.endswith("_quantized") for name in outer)  # int8 weights and scales: outer initializers
    # the Q/DQ arithmetic as written (ORT's optimizer would run the step graph's S8S8 pairs as integer
    # GEMMs and the body's as float, and 8 chaotic steps amplify that rounding difference)
    feeds, plain = small.examples.feeds(0, 16), {"optimization": Optimization.DISABLED}
    step = ort_session(str(tmp_path / "step.int8.onnx"), **plain)
    names = ["logits", "q_halt_logits", "steps_used"]
    for rule in ("off", "q"):
        loop = ort_session(str(tmp_path / f"{rule}.int8.onnx"), **plain)
        got = dict(zip(names, loop.run(names, feeds), strict=True))
        host = host_loop(step, feeds, LoopHalt.parse(rule, q_halt_only=False), 8)
        assert np.array_equal(got["steps_used"], host["steps_used"]), rule
        np.testing.assert_allclose(got["logits"], host["logits"], atol=1e-5)  # the same Q/DQ, the same ranges
        np.testing.assert_allclose(got["q_halt_logits"], host["q_halt_logits"], atol=1e-5)  # NaN where NaN
    assert (got["steps_used"] < 8).any()  # the q rule really halts rows early


def test_fp8_and_nvfp4_loop_graphs_are_written_in_the_body_and_run(small, jobs, tmp_path) -> None:
    from hrm_deploy.precision.fp8 import quantize_fp8
    from hrm_deploy.precision.nvfp4 import quantize_nvfp4, simulate_on_cpu

    feeds = small.examples.feeds(0, 4)
    fp32 = ort_session(str(small.off)).run(["logits"], feeds)[0].argmax(-1)
    for name, write in (("fp8", quantize_fp8), ("nvfp4", quantize_nvfp4)):
        write(jobs["off"], tmp_path / f"{name}.onnx")
        model = onnx.load(str(tmp_path / f"{name}.onnx"))
        assert find_loop(model) is not None and any("Quantize" in n.op_type for n in loop_body(model).node)
        runnable = simulate_on_cpu(model) if name == "nvfp4" else model
        got = ort_session(runnable.SerializeToString()).run(["logits"], feeds)[0].argmax(-1)
        assert (got == fp32).mean() > 0.9, name


def test_entropy_calibration_of_a_loop_graph_is_refused_in_one_line(small, tmp_path) -> None:
    from hrm_deploy.errors import ConfigError
    from hrm_deploy.precision.job import new_job

    model = onnx.load(str(small.q), load_external_data=False)
    with pytest.raises(ConfigError, match="--calib-method entropy of a loop graph.*minmax"):
        new_job(small.q, model, graph_metadata(model), small.examples, QuantConfig("entropy"), tmp_path, "x")


def test_build_engine_cpu_int8_of_a_loop_graph_is_within_budget_and_verifies(
    tiny_loop, trained_tiny, tmp_path, monkeypatch
) -> None:
    """The cpu target's static INT8 of the trained fixture's loop graph: integer GEMMs and fused
    attention in the body, the accuracy check against FP32 on the held-out puzzles passed, then
    ``verify`` passes. (The bundled sudoku-small's INT8 moves the halting step of about a quarter
    of its rows under the q rule, loop graph or host loop alike; docs/loop.md has its numbers.)"""
    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.export.loop_body import all_nodes
    from hrm_deploy.verify import verify

    monkeypatch.chdir(tmp_path)  # calib/
    config = EngineConfig(
        "int8", target="cpu", calib_data=trained_tiny.data, calib_samples=CALIB, options=CpuOptions(threads=1)
    )
    result = build_engine(tiny_loop, config, tmp_path / "t.int8.cpu.ort.onnx", quiet=True)
    manifest = json.loads(result.manifest.read_text())
    assert manifest["mode"] == "loop" and manifest["recipe"]["accuracy"]["checked"]
    assert manifest["recipe"]["accuracy"]["measured"]["loss_points"] <= 1.0
    assert manifest["recipe"]["activations"]["activations"] == "uint8"  # what ORT fuses in a Loop's body
    assert manifest["build"]["fusions"]["attention"] > 0 and manifest["build"]["fusions"]["checked_blocks"] > 0
    model = onnx.load(str(result.path))
    body_ops = {n.op_type for n in loop_body(model).node}
    assert "MatMulIntegerToFloat" in body_ops and "MultiHeadAttention" in body_ops
    assert "MatMulIntegerToFloat" not in {n.op_type for n in model.graph.node}
    assert len(all_nodes(model)) > len(model.graph.node)
    report = verify(result.path, trained_tiny.data, samples=64, quiet=True, threads=1)
    assert report["passed"], report["failures"]
    # FP32: the fusions in the body, the answers the export's
    fp32 = build_engine(
        tiny_loop,
        EngineConfig("fp32", target="cpu", options=CpuOptions(threads=1)),
        tmp_path / "t.cpu.ort.onnx",
        quiet=True,
    )
    assert "MultiHeadAttention" in {n.op_type for n in loop_body(onnx.load(str(fp32.path))).node}
    feeds = {"inputs": np.ones((2, 81), np.int32), "puzzle_identifiers": np.zeros(2, np.int32)}
    want = ort_session(str(tiny_loop)).run(["logits", "steps_used"], feeds)
    got = ort_session(str(fp32.path)).run(["logits", "steps_used"], feeds)
    np.testing.assert_allclose(got[0], want[0], atol=1e-4)
    assert np.array_equal(got[1], want[1])


def test_cpu_int8_recipes_without_scales_are_refused_for_loop_graphs(small, tmp_path) -> None:
    from hrm_deploy.backends.ort.builder.cpu import build_cpu
    from hrm_deploy.backends.ort.builder.options import CpuOptions
    from hrm_deploy.engines.config import EngineConfig
    from hrm_deploy.errors import ConfigError

    for recipe in ("dynamic", "blockwise"):
        with pytest.raises(ConfigError, match=f"--cpu-int8 {recipe} of a loop graph.*static"):
            build_cpu(
                small.q,
                EngineConfig("int8", target="cpu", options=CpuOptions(int8_recipe=recipe)),
                tmp_path / "never.onnx",
                quiet=True,
            )
    assert not (tmp_path / "never.onnx").exists()


@pytest.mark.trt
@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_tensorrt_rtx_builds_a_loop_engine_on_cpu(tiny_loop, trained_tiny, tmp_path, monkeypatch, precision) -> None:
    """A real TensorRT-RTX build (AOT, no GPU needed) of the trained fixture's loop graph: INT8 with its
    Q/DQ in the body (TensorRT's convention), FP16 with its float islands there; the network's I/O is
    the loop graph's."""
    pytest.importorskip("tensorrt_rtx")
    import tensorrt_rtx as trt

    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.runtime.artifact import read_contract

    monkeypatch.chdir(tmp_path)  # calib/, the precision graph beside a copy of the export
    export = tmp_path / "tiny.loop.onnx"
    for name in (export.name, f"{export.name}.manifest.json"):
        shutil.copy(Path(tiny_loop).with_name(name), tmp_path / name)
    config = EngineConfig(
        precision,
        calib_data=trained_tiny.data,
        calib_samples=16,
        max_batch=8,
        options=TensorRTOptions(timing_cache=None),
    )
    result = build_engine(export, config, tmp_path / f"l.{precision}.engine", quiet=True)
    manifest = json.loads(result.manifest.read_text())
    assert result.path.stat().st_size > 100_000 and manifest["backend"]["name"] == "tensorrt-rtx"
    assert manifest["mode"] == "loop" and manifest["precision"] == precision
    network = manifest["build"]["network"]
    if precision == "int8":
        assert network["qdq_layers"] > 0 and network["output_dtypes"].get("INT8")
    else:
        assert network["output_dtypes"].get("HALF") and not network["qdq_layers"]
    assert read_contract(result.path).mode == "loop"
    graph = tmp_path / f"tiny.loop.{precision}.onnx"  # what the engine was built from
    logger = trt.Logger(trt.Logger.ERROR)
    network = trt.Builder(logger).create_network(0)
    assert trt.OnnxParser(network, logger).parse_from_file(str(graph))
    inputs = {network.get_input(i).name: network.get_input(i).dtype for i in range(network.num_inputs)}
    outputs = {network.get_output(i).name: network.get_output(i).dtype for i in range(network.num_outputs)}
    assert inputs == {"inputs": trt.int32, "puzzle_identifiers": trt.int32}
    assert outputs == {
        "logits": trt.float32,
        "q_halt_logits": trt.float32,
        "q_continue_logits": trt.float32,
        "steps_used": trt.int32,
    }
