"""One precision pipeline: on the ``--int8`` path the FP32 graph is parsed once and calibrated once,
whatever the accuracy check and its fallback do afterwards (every writer and probe works from the
same job). Counted in the precision stage (TensorRT targets) and in the cpu target's static INT8."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest

import hrm_deploy.precision.calibrate as calibrate
from hrm_deploy.backends.ort.builder.options import CpuOptions


@pytest.fixture
def counts(monkeypatch):
    """How often the FP32 source (``counts.source``) is parsed and how often ranges are measured."""
    seen = {"parses": 0, "calibrations": 0, "source": None}
    load, measure = onnx.load, calibrate._calibrate

    def counting_load(f, *args, **kwargs):
        if seen["source"] is not None and isinstance(f, (str, Path)) and Path(f).resolve() == seen["source"]:
            seen["parses"] += 1
        return load(f, *args, **kwargs)

    def counting_calibrate(*args, **kwargs):
        seen["calibrations"] += 1
        return measure(*args, **kwargs)

    monkeypatch.setattr(onnx, "load", counting_load)
    monkeypatch.setattr(calibrate, "_calibrate", counting_calibrate)
    return seen


def test_the_precision_stage_parses_and_calibrates_once(tiny_onnx, tmp_path, counts, harm_quantized):
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph

    harm_quantized(0.05)  # the fallback runs: candidates and the published graph come from the same job
    counts["source"] = Path(tiny_onnx.unrolled).resolve()
    cfg = PrecisionConfig(
        "int8", calib_data=tiny_onnx.data, quant=QuantConfig(samples=16), cache_dir=str(tmp_path / "calib")
    )
    result = make_precision_graph(tiny_onnx.unrolled, cfg, out=tmp_path / "m.int8.onnx", quiet=True)
    assert result.report["accuracy"]["kept_float"]  # the fallback ran: many writes, one job
    assert (counts["parses"], counts["calibrations"]) == (1, 1)


@pytest.mark.slow
def test_a_loop_graphs_precision_stage_parses_and_calibrates_once(
    tiny_loop, trained_tiny, tmp_path, counts, harm_quantized
):
    """The same with the loop graph: its body planned, calibrated inside the loop in one pass, every
    probe of the fallback written into the body from the same job."""
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph

    harm_quantized(0.05)  # the fallback runs: candidates and the published graph come from the same job
    counts["source"] = Path(tiny_loop).resolve()
    cfg = PrecisionConfig(
        "int8", calib_data=trained_tiny.data, quant=QuantConfig(samples=16), cache_dir=str(tmp_path / "calib")
    )
    result = make_precision_graph(tiny_loop, cfg, out=tmp_path / "l.int8.onnx", quiet=True)
    assert result.report["accuracy"]["kept_float"]
    assert (counts["parses"], counts["calibrations"]) == (1, 1)


@pytest.mark.slow
def test_the_cpu_targets_static_int8_parses_and_calibrates_once(tiny_onnx, tmp_path, counts):
    from hrm_deploy.backends.ort.builder.cpu import build_cpu
    from hrm_deploy.backends.ort.builder.options import CpuOptions
    from hrm_deploy.engines.config import EngineConfig

    counts["source"] = Path(tiny_onnx.unrolled).resolve()
    config = EngineConfig(
        "int8",
        target="cpu",
        calib_data=tiny_onnx.data,
        calib_samples=16,
        calib_cache=str(tmp_path / "calib"),
        options=CpuOptions(threads=1),
    )
    build_cpu(tiny_onnx.unrolled, config, tmp_path / "t.int8.cpu.ort.onnx", quiet=True)
    assert (counts["parses"], counts["calibrations"]) == (1, 1)


@pytest.mark.slow
def test_build_engine_int8_parses_the_export_once_and_calibrates_once(tiny_onnx, tmp_path, counts, monkeypatch):
    """The whole default --int8 path of the build stage (the unroll's cost estimate, the precision
    graph, its accuracy check; the TensorRT-RTX build reads the precision graph, not the export)."""
    pytest.importorskip("tensorrt_rtx")
    from hrm_deploy.engines.build import EngineConfig, build_engine

    monkeypatch.chdir(tmp_path)
    export = tmp_path / "tiny.onnx"  # the precision graph is written beside it: not in the shared fixture
    for name in ("tiny.onnx", "tiny.onnx.manifest.json"):
        shutil.copy(Path(tiny_onnx.unrolled).with_name(name), tmp_path / name)
    counts["source"] = export.resolve()
    config = EngineConfig("int8", calib_data=tiny_onnx.data, calib_samples=16)
    build_engine(export, config, tmp_path / "t.int8.engine", quiet=True)
    assert (counts["parses"], counts["calibrations"]) == (1, 1)


def test_build_engine_cpu_int8_parses_the_export_once(tiny_onnx, tmp_path, counts, monkeypatch):
    from hrm_deploy.engines.build import EngineConfig, build_engine

    monkeypatch.chdir(tmp_path)  # the calibration cache: calib/ here
    counts["source"] = Path(tiny_onnx.unrolled).resolve()
    config = EngineConfig(
        "int8",
        target="cpu",
        calib_data=tiny_onnx.data,
        calib_samples=16,
        accuracy_check=False,
        options=CpuOptions(threads=1),
    )
    build_engine(tiny_onnx.unrolled, config, tmp_path / "t.int8.cpu.ort.onnx", quiet=True)
    assert (counts["parses"], counts["calibrations"]) == (1, 1)
