"""The GPU device check's FP8 / NVFP4 engine stages: run where TensorRT and the GPU allow, else skipped with the reason."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "device_check_bundled.py"


@pytest.fixture
def check(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("device_check_bundled", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ran = []

    def fake_stage(name, argv, limit, log):
        ran.append((name, argv, limit))
        return {"check": name, "rc": 0, "ok": True, "seconds": 1.0, "log": log.name, "tail": ""}

    monkeypatch.setattr(module, "run_stage", fake_stage)
    module.ran = ran
    return module


def test_an_h100_without_tensorrt_skips_both_with_their_reasons(check, monkeypatch, tmp_path):
    monkeypatch.setattr(check, "tensorrt_flavour", lambda: None)
    fp8, nvfp4 = check.reduced_precision_stages(tmp_path, tmp_path / "data", tmp_path, "9.0", 300.0)
    assert fp8["skipped"] == "TensorRT (tensorrt or tensorrt_rtx) is not installed"
    assert nvfp4["skipped"] == "nvfp4 needs compute capability >= 10.0; this GPU is 9.0"
    assert not check.ran


def test_a_blackwell_gpu_with_tensorrt_builds_and_verifies_both_within_the_budget(check, monkeypatch, tmp_path):
    monkeypatch.setattr(check, "tensorrt_flavour", lambda: (["--target", "datacenter"], "TensorRT"))
    results = check.reduced_precision_stages(tmp_path, tmp_path / "data", tmp_path, "12.0", 300.0)
    assert [r["ok"] and not r.get("skipped") for r in results] == [True, True]
    for (_, argv, limit), precision in zip(check.ran, ("fp8", "nvfp4")):
        script = argv[-1]
        assert f"build-engine {tmp_path / 'sudoku-small.onnx'} --precision {precision}" in script
        assert "verify" in script and "--calib-data" in script and limit <= 300.0
    assert check.reduced_precision_stages(tmp_path, tmp_path, tmp_path, "12.0", 30.0)[0]["skipped"].startswith(
        "only 30 s"
    )
