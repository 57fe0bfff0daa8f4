"""Quantized builds as a user runs them, on the bundled model with the defaults: ``build-engine --int8
--target cpu`` and ``build-engine --int8`` (TensorRT-RTX, which builds on CPU) write a graph within
the accuracy rule, the same graph on every run, and the graph published is the one measured last
(measured again here, its numbers are the record's; its float set is the one the fallback chose). A
halting loop graph's build and ``verify`` agree. One builds per target and module: they are shared
by every assertion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hrm_deploy.agreement import CELL_BAND, flip_margin
from hrm_deploy.engines.build import EngineConfig, build_engine
from hrm_deploy.export.metadata import graph_metadata
from hrm_deploy.manifest import read_manifest
from hrm_deploy.onnx_runtime import load_onnx
from hrm_deploy.precision.rule import Rule
from tests.conftest import quantized_weights

pytestmark = pytest.mark.slow


def _export(folder: Path, **export) -> Path:
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.train.presets import bundled_checkpoint

    folder.mkdir(parents=True, exist_ok=True)
    return export_onnx(bundled_checkpoint(), folder / "m.onnx", ExportConfig(parity=False, **export), quiet=True).path


def _build(folder: Path, export: Path, config: EngineConfig, out: str):
    """``build_engine`` run from ``folder`` (its own calibration cache: ``calib/`` there)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        return build_engine(export, config, folder / out, quiet=True)


@pytest.fixture(scope="module")
def bundled(tmp_path_factory):
    """The bundled model's FP32 export (the default ``hrm-deploy export``), shared by the builds."""
    return _export(tmp_path_factory.mktemp("bundled"))


@pytest.fixture(scope="module")
def cpu_builds(bundled, tmp_path_factory):
    """The bundled model's default cpu INT8, built twice from scratch (fresh caches)."""
    export = bundled
    runs = []
    for name in ("first", "second"):
        folder = tmp_path_factory.mktemp(name)
        runs.append(_build(folder, export, EngineConfig("int8", target="cpu"), "m.int8.cpu.ort.onnx"))
    return export, runs


@pytest.fixture(scope="module")
def rtx_build(bundled, tmp_path_factory):
    """The bundled model's default ``build-engine --int8`` (TensorRT-RTX), and its precision graph
    made a second time from scratch."""
    pytest.importorskip("tensorrt_rtx")
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph

    folder, export = tmp_path_factory.mktemp("rtx"), bundled
    engine = _build(folder, export, EngineConfig("int8"), "m.int8.engine")
    again = tmp_path_factory.mktemp("rtx-again")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(again)
        second = make_precision_graph(export, PrecisionConfig("int8"), out=again / "m.int8.onnx", quiet=True)
    return export, engine, export.with_name("m.int8.onnx"), second.path  # the stage writes beside the export


def _within(record: dict) -> None:
    """The record's published measurement is within the INT8 rule, on the whole holdout."""
    measured = record["measured"]
    rule = Rule.of("int8", record["budget_points"])
    assert record["checked"] and record["decided"]["puzzles"] == measured["holdout_puzzles"]
    assert measured["loss_points"] <= rule.budget and measured["nonfinite_values"] == 0
    assert measured["argmax_agreement_pct"] >= 100 * rule.thresholds.min_argmax_agreement
    assert measured["q_halt_sign_agreement_pct"] >= 100 * rule.thresholds.min_q_halt_sign_agreement
    assert measured["largest_flip_margin"] <= flip_margin(rule.thresholds)  # verify's cell judgement
    assert measured["largest_cell_error"] <= CELL_BAND * rule.thresholds.max_logits_rel_error


def _measured_again(fp32: Path, graph: Path, record: dict, data: str) -> None:
    """The published graph, run again on the holdout the build used, gives the record's numbers."""
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.precision.accuracy import GraphRunner
    from hrm_deploy.precision.rule import quality

    measured = record["measured"]
    examples = load_examples(data, measured["holdout_puzzles"], split="test")
    with GraphRunner(graph_metadata(load_onnx(fp32)), table_of=fp32) as runner:
        again = quality(runner(fp32, examples), runner(graph, examples), examples.labels).as_dict()
    assert again == measured


def _float_set_is_published(fp32: Path, graph: Path, record: dict) -> None:
    """The weights of the nodes the record keeps float are read as float in the published graph,
    and no other planned weight is."""
    model = load_onnx(fp32)
    weight_of = {n.name: n.input[1] for n in model.graph.node if n.op_type == "MatMul"}
    kept = {weight_of[name] for name in record["kept_float_nodes"]}
    assert kept == {k["weight"] for k in record["kept_float"]}
    assert quantized_weights(graph, sorted(kept)) == 0


def test_the_bundled_cpu_int8_build_is_within_the_rule_the_same_every_run_and_published_as_measured(cpu_builds):
    export, (first, second) = cpu_builds
    records = [read_manifest(run.path)["recipe"] for run in (first, second)]
    accuracy = [r["accuracy"] for r in records]
    _within(accuracy[0])
    assert first.path.read_bytes() == second.path.read_bytes()  # the same graph, byte for byte
    assert accuracy[0]["kept_float_nodes"] == accuracy[1]["kept_float_nodes"]
    assert accuracy[0]["measured"] == accuracy[1]["measured"] and accuracy[0]["decided"] == accuracy[1]["decided"]
    assert records[0]["activations"] == records[1]["activations"]  # the ISA's choice, recorded
    _float_set_is_published(export, first.path, accuracy[0])
    _measured_again(export, first.path, accuracy[0], records[0]["calibration"]["data"])


def test_the_bundled_cpu_int8_graph_passes_verify(cpu_builds):
    """The rule judges what verify judges (the cell judgement included), so the graph the default
    build wrote passes ``verify`` against the checkpoint."""
    from hrm_deploy.provenance import default_data
    from hrm_deploy.verify import verify

    export, (first, _) = cpu_builds
    report = verify(first.path, default_data(export, "--data", {"test": None}).path, samples=64, quiet=True)
    assert report["passed"], report["failures"]


def test_the_bundled_tensorrt_rtx_int8_build_is_within_the_rule_and_the_same_every_run(rtx_build):
    export, engine, graph, again = rtx_build
    assert engine.path.is_file()
    report = json.loads(graph.with_name(graph.name + ".manifest.json").read_text())["report"]
    _within(report["accuracy"])
    assert graph.read_bytes() == again.read_bytes()  # the precision graph the engine was built from
    _float_set_is_published(export, graph, report["accuracy"])
    _measured_again(export, graph, report["accuracy"], report["calibration"]["data"])


def test_a_halting_loop_graphs_build_and_its_verify_agree(tmp_path):
    """The docs/loop.md run: a loop graph that halts by its Q head, built cpu INT8 with the defaults,
    then verified on 64 puzzles: the build's rule judges the halting steps and q_halt signs as
    verify does, so verify passes, or the build is refused with both measurements."""
    from hrm_deploy.errors import ConfigError
    from hrm_deploy.provenance import default_data
    from hrm_deploy.verify import verify

    export = _export(tmp_path, mode="loop", halt="q")
    try:
        built = _build(tmp_path, export, EngineConfig("int8", target="cpu"), "loopq.int8.cpu.ort.onnx")
    except ConfigError as refused:
        message = str(refused)
        assert "halting steps" in message and "all quantized:" in message and "even with" in message
        return
    record = read_manifest(built.path)["recipe"]["accuracy"]
    assert record["measured"]["steps_agreement_pct"] >= 95.0
    data = default_data(export, "--data", {"test": None}).path
    report = verify(built.path, data, samples=64, quiet=True)
    assert report["passed"], report["failures"]


def test_a_threshold_changed_in_one_place_is_obeyed_by_both_targets(tiny_onnx, tmp_path, monkeypatch):
    """The INT8 row's argmax threshold raised to 100 % (one change: the PRECISIONS row, which verify
    reads too): the cpu target's static INT8 and the precision stage's INT8 (TensorRT's graph) both
    hold their builds to it: a graph with one flipped cell is not published."""
    from dataclasses import replace

    from hrm_deploy.backends.ort.builder.cpu import build_cpu
    from hrm_deploy.backends.ort.builder.options import CpuOptions
    from hrm_deploy.engines.config import EngineConfig
    from hrm_deploy.errors import ConfigError
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph
    from hrm_deploy.precision.registry import PRECISIONS

    row = PRECISIONS["int8"]
    monkeypatch.setitem(PRECISIONS, "int8", replace(row, thresholds=replace(row.thresholds, min_argmax_agreement=1.0)))
    cache = str(tmp_path / "calib")
    builds = {
        "cpu": lambda: read_manifest(
            build_cpu(
                tiny_onnx.unrolled,
                EngineConfig(
                    "int8",
                    target="cpu",
                    calib_data=tiny_onnx.data,
                    calib_samples=32,
                    calib_cache=cache,
                    options=CpuOptions(threads=1),
                ),
                tmp_path / "t.int8.cpu.ort.onnx",
                quiet=True,
            ).path
        )["recipe"]["accuracy"],
        "precision stage": lambda: make_precision_graph(
            tiny_onnx.unrolled,
            PrecisionConfig("int8", calib_data=tiny_onnx.data, quant=QuantConfig(samples=32), cache_dir=cache),
            out=tmp_path / "t.int8.onnx",
            quiet=True,
        ).report["accuracy"],
    }
    for target, build in builds.items():
        try:
            record = build()
        except ConfigError as refused:  # no mix without a flipped cell
            assert "needs >= 100" in str(refused) and ">= 100 % argmax agreement" in str(refused), target
            continue
        assert record["measured"]["argmax_agreement_pct"] == 100.0, target
        assert record["thresholds"]["min_argmax_agreement"] == 1.0 and record["kept_float"], target
