"""The second, optional GPU check (the bundled model's user path) on a machine without a GPU: with its
stages faked, its order, its 7-minute budget and partial results."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.device_check_helpers import load_check


@pytest.fixture
def check(monkeypatch):
    return load_check("device_check_bundled", monkeypatch)


@pytest.fixture
def fake_gpu(check, monkeypatch):
    """A GPU as far as the check's parent sees it, and stages that take their whole time limit
    on a fake clock (the worst case for the budget); builds leave an engine and manifest."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(check, "tensorrt_flavour", lambda: None)
    clock = {"now": 0.0}
    monkeypatch.setattr(check.lib.time, "perf_counter", lambda: clock["now"])
    fake = SimpleNamespace(ran=[], seen_json=[], unloadable=False, failing=None, share=1.0)

    def stage(name, argv, limit, log):
        clock["now"] += fake.share * limit  # the share of its limit a stage takes
        fake.ran.append((name, argv, limit))
        fake.seen_json.append((log.parent / "device_check_bundled.json").is_file())
        if "build-engine" in argv and "-o" in argv:
            engine = Path(argv[argv.index("-o") + 1])
            engine.write_bytes(b"engine")
            manifest = {"load_check": {"ok": not fake.unloadable, "reason": None}}
            engine.with_name(engine.name + ".manifest.json").write_text(json.dumps(manifest))
        ok = not (fake.failing and fake.failing in name)
        log.write_text("log")
        return {"check": name, "rc": 0 if ok else 1, "ok": ok, "seconds": limit, "log": log.name, "tail": ""}

    monkeypatch.setattr(check.lib, "run_stage", stage)
    monkeypatch.setattr(check, "run_stage", stage)
    return fake


def test_the_users_path_keeps_the_7_minute_budget_in_priority_order(check, fake_gpu, tmp_path):
    ran, seen_json = fake_gpu.ran, fake_gpu.seen_json
    assert check.main([str(tmp_path), "--no-diagnose"]) == 0
    names = [name for name, _, _ in ran]
    assert sum(limit for _, _, limit in ran) <= check.TOTAL_BUDGET_S == 420.0
    assert names[:5] == [
        "data sudoku (500 held-out puzzles of the bundled model's spec)",
        "build-engine --backend torch (bundled model, CUDA, max batch 1024)",
        "verify (bundled engine on CUDA vs the PyTorch reference, fresh process)",
        "solve a file (bundled engine, fresh process)",
        "bench (bundled engine, batch 1 and 64, fresh process)",
    ]
    assert not any("load matrix" in n for n in names)  # loads worked and no --diagnose
    assert all(seen_json[1:])  # the summary existed before every stage after the first
    summary = json.loads((tmp_path / "device_check_bundled.json").read_text())
    skipped = [c for c in summary["checks"] if c.get("skipped")]
    assert skipped and all(
        c["skipped"].startswith(("budget:", "PyTriton", "TensorRT", "fp8", "nvfp4")) for c in skipped
    )


def test_the_cause_variants_run_first_when_diagnosing_or_after_a_failed_cli_load(check, fake_gpu, tmp_path):
    check.main([str(tmp_path / "a"), "--diagnose"])
    names = [name for name, _, _ in fake_gpu.ran]
    assert names[2] == "AOTInductor load matrix, cause variants (max batch 1024)"
    matrix = fake_gpu.ran[2][1]
    assert matrix[1] == "scripts/diagnostics/2026-11-aoti-load/aoti_load_matrix.py"
    assert matrix[2].endswith("sudoku-small.step.cuda.pt2") and "--cause" in matrix and "--fault-report" in matrix
    # no --diagnose: a CLI load that fails (verify) brings the matrix in right after it
    fake_gpu.ran.clear()
    fake_gpu.failing = "verify (bundled engine"
    assert check.main([str(tmp_path / "b"), "--no-diagnose"]) == 1
    names = [name for name, _, _ in fake_gpu.ran]
    assert names[2:4] == [
        "verify (bundled engine on CUDA vs the PyTorch reference, fresh process)",
        "AOTInductor load matrix, cause variants (max batch 1024)",
    ]
    # and so does a build whose own probe could not load its package in a fresh process
    fake_gpu.ran.clear()
    fake_gpu.failing, fake_gpu.unloadable = None, True
    check.main([str(tmp_path / "c"), "--no-diagnose"])
    assert [name for name, _, _ in fake_gpu.ran][2] == "AOTInductor load matrix, cause variants (max batch 1024)"
    summary = json.loads((tmp_path / "c" / "device_check_bundled.json").read_text())
    assert summary["bundled_load_check"] == {"ok": False, "reason": None}
