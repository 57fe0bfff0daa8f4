"""Unrolled TensorRT builds over the measured budget are opt-in, and the engine
build says what it is doing: build_engine driven end to end with its worker run in this process
against the fake TensorRT of test_worker."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from hrm_deploy.backends.tensorrt.builder import cost, engine as trt_build, worker
from hrm_deploy.backends.tensorrt.builder.options import TensorRTOptions
from hrm_deploy.engines import build
from hrm_deploy.engines.build import EngineConfig, build_engine
from hrm_deploy.errors import ConfigError
from hrm_deploy.manifest import manifest_path
from tests.backends.tensorrt.test_worker import Calls, fake_tensorrt, worker_spec

ROOT = Path(__file__).resolve().parents[3]
SUDOKU_SIZE_UNROLL = 19_830  # the measured 16-step Sudoku-size graph's nodes (FP16 entry)


def test_the_estimate_is_the_benchmark_file():
    measured = json.loads((ROOT / "benchmarks/results/trt_build_cost.json").read_text())
    for precision in ("fp16", "int8"):
        entry = measured["builds"][f"unrolled/{precision}"]
        assert cost.MEASURED[precision] == (entry["onnx_nodes"], entry["build_seconds"], entry["peak_host_mib"])
    goal = measured["goals"]["unrolled"]
    assert (cost.BUDGET_SECONDS, cost.BUDGET_MIB) == (goal["seconds"], goal["peak_mib"])


def test_over_budget_unrolled_graph_is_refused_with_its_cost_and_both_ways_on():
    meta = {"mode": "unrolled", "steps": 16}
    with pytest.raises(ConfigError) as refused:
        cost.check_unrolled_build(meta, SUDOKU_SIZE_UNROLL, "fp16", False, "sudoku.onnx")
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("sudoku.onnx is a 16-step unrolled graph; its fp16 TensorRT build would take about 8 min")
    assert "3.8 GB of host memory" in message and "benchmarks/results/trt_build_cost.json" in message
    assert "2-core machine" in message and "over the 3 min / 4 GB" in message
    assert "hrm-deploy export --mode step" in message and "--allow-unrolled" in message
    # INT8 measured 256 s and 4.6 GB for 19,062 nodes: refused on both
    with pytest.raises(ConfigError, match=r"about 4 min and 4\.8 GB"):
        cost.check_unrolled_build(meta, SUDOKU_SIZE_UNROLL, "int8", False, "sudoku.int8.onnx")


def test_allowed_unrolled_build_returns_its_estimate_and_small_graphs_pass():
    meta = {"mode": "unrolled", "steps": 16}
    allowed = cost.check_unrolled_build(meta, SUDOKU_SIZE_UNROLL, "bf16", True, "m.onnx")
    assert allowed is not None and allowed.to_dict() == {
        "compute_nodes": SUDOKU_SIZE_UNROLL,
        "estimated_seconds": 501,  # bf16 was not measured: FP16's figures
        "estimated_peak_mib": 3940,
    }
    assert cost.check_unrolled_build({"mode": "step", "steps": 16}, 10**6, "fp16", False, "m.step.onnx") is None
    assert cost.check_unrolled_build(meta, 2_000, "fp16", False, "m.onnx") is None  # ~51 s: within budget


def test_precision_graphs_count_like_their_export():
    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            [
                onnx.helper.make_node(op, ["x"], [f"y{i}"])
                for i, op in enumerate(["MatMul", "Cast", "QuantizeLinear", "DequantizeLinear", "Add"])
            ],
            "g",
            [],
            [],
        )
    )
    assert cost.compute_nodes(model) == 2


@pytest.mark.slow
def test_the_bundled_default_builds_without_opt_in(small_onnx):
    """CI and the README build the embedded sudoku-small export (8-step unroll) with no flag."""
    from hrm_deploy.export.metadata import graph_metadata

    model = onnx.load(str(small_onnx), load_external_data=False)
    meta = graph_metadata(model)
    assert meta["mode"] == "unrolled" and meta["steps"] == 8
    for precision in ("fp16", "int8", "fp32"):
        assert cost.check_unrolled_build(meta, cost.compute_nodes(model), precision, False, "small.onnx") is None


def _worker_in_process(monkeypatch, trt):
    """build_engine's child process, run in this one against ``trt`` (the fake TensorRT)."""
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    specs = []

    def run(argv, **kwargs):
        spec = json.loads(Path(argv[-1]).read_text())
        specs.append(spec)
        return subprocess.CompletedProcess(argv, worker.build(spec), "", "")

    monkeypatch.setattr(trt_build.subprocess, "run", run)
    return specs


@pytest.fixture
def unrolled(tiny_onnx, tmp_path):
    graph = tmp_path / "tiny.onnx"
    shutil.copy(tiny_onnx.unrolled, graph)
    shutil.copy(manifest_path(tiny_onnx.unrolled), manifest_path(graph))
    return graph


def test_small_unrolled_graph_builds_without_the_flag(unrolled, tmp_path, monkeypatch):
    specs = _worker_in_process(monkeypatch, fake_tensorrt(Calls()))
    result = build_engine(
        unrolled,
        EngineConfig("fp32", backend="tensorrt", options=TensorRTOptions(timing_cache=None)),
        out=tmp_path / "m.engine",
        quiet=True,
    )
    manifest = json.loads(result.manifest.read_text())
    assert len(specs) == 1 and manifest["mode"] == "unrolled"
    assert manifest["unrolled_opt_in"] is None and manifest["config"]["allow_unrolled"] is False


@pytest.mark.slow
def test_large_unrolled_graph_builds_its_step_graph_unless_asked(unrolled, tmp_path, monkeypatch, capsys, cli_logs):
    """The documented lines (export, then build-engine) at full size: the unrolled build would be
    over budget, so the single-step graph of the same checkpoint is exported and built instead."""
    specs = _worker_in_process(monkeypatch, fake_tensorrt(Calls()))
    real = trt_build.compute_nodes
    monkeypatch.setattr(  # as if the unroll were Sudoku-size with 16 steps; the step graph counts as it is
        trt_build, "compute_nodes", lambda model: SUDOKU_SIZE_UNROLL if len(model.graph.node) > 60 else real(model)
    )
    step = build_engine(
        unrolled,
        EngineConfig("fp32", backend="tensorrt", options=TensorRTOptions(timing_cache=None)),
        out=tmp_path / "s.engine",
        quiet=False,
    )
    err = capsys.readouterr().err
    assert "building its single-step graph instead" in err and "about 8 min and 3.8 GB" in err
    manifest = json.loads(step.manifest.read_text())
    assert manifest["mode"] == "step" and step.source_onnx == tmp_path / "tiny.step.onnx"
    assert manifest["step_instead_of_unrolled"]["unrolled_graph"] == str(unrolled)
    assert json.loads((tmp_path / "tiny.step.onnx.manifest.json").read_text())["mode"] == "step"
    again = build_engine(  # the step export of the same checkpoint is reused, not redone
        unrolled,
        EngineConfig("fp32", backend="tensorrt", options=TensorRTOptions(timing_cache=None)),
        out=tmp_path / "s2.engine",
        quiet=True,
    )
    assert again.source_onnx == step.source_onnx and len(specs) == 2
    specs.clear()

    result = build_engine(
        unrolled,
        EngineConfig("fp32", backend="tensorrt", options=TensorRTOptions(timing_cache=None, allow_unrolled=True)),
        out=tmp_path / "m.engine",
    )
    err = capsys.readouterr().err
    announced = err.index("building the unrolled graph as asked (--allow-unrolled): about 8 min and 3.8 GB")
    assert announced < err.index("... building fp32 engine")  # said before the build starts
    manifest = json.loads(result.manifest.read_text())
    assert len(specs) == 1 and manifest["config"]["allow_unrolled"] is True
    assert manifest["unrolled_opt_in"] == {
        "compute_nodes": SUDOKU_SIZE_UNROLL,
        "estimated_seconds": 501,
        "estimated_peak_mib": 3940,
    }


@pytest.mark.parametrize("monitor", [True, False])
def test_the_worker_reports_parsing_and_the_builders_phases(tmp_path, monkeypatch, monitor):
    calls = Calls()
    _worker_in_process(monkeypatch, fake_tensorrt(calls, progress_monitor=monitor))
    spec = worker_spec(tmp_path)
    said: list[str] = []
    child = trt_build._run_worker(spec, tmp_path / "spec.json", said.append)
    assert child.returncode == 0
    phases = ["Building engine 0/2", "Building engine 0/2 > Timing tactics 0/3"] if monitor else []
    assert said == ["parsing ONNX", "building (3 network layers)", *phases, "serializing and inspecting the engine"]
    assert json.loads((tmp_path / "result.json").read_text())["progress_monitor"] is monitor
    assert (("monitor",) in calls) is monitor


def test_build_engine_cli_passes_allow_unrolled(monkeypatch):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    seen = {}

    def fake_build(onnx_path, config, out, quiet=False):
        seen["config"] = config
        return build.EngineResult(Path("m.engine"), Path("m.engine.manifest.json"), Path("m.onnx"), {})

    monkeypatch.setattr(build, "build_engine", fake_build)
    for flags, expected in (([], False), (["--allow-unrolled"], True)):
        run = CliRunner().invoke(app, ["build-engine", "m.onnx", *flags])
        assert run.exit_code == 0, run.output
        assert seen["config"].options.allow_unrolled is expected
