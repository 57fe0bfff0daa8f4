"""The GPU device check on a machine without a GPU: a clean no-op, and (with its stages faked)
its order, its 7-minute budget, text logs and partial results; the GPU latency benchmark's
kernel-time split and its checkpoint/no-GPU paths."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def check():
    return _load("device_check", ROOT / "scripts" / "device_check.py")


def test_without_a_gpu_the_check_says_so_in_one_line_and_exits_0(check, tmp_path, capsys):
    pytest.importorskip("torch")
    assert check.main([str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out == "no CUDA GPU: nothing to check\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_shell_entry_is_a_clean_no_op_without_a_gpu(tmp_path):
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", "scripts/device_check.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "no CUDA GPU: nothing to check\n", "")
    assert not (tmp_path / "out").exists()


def test_a_stage_that_times_out_keeps_its_output_as_text_and_takes_its_children(check, tmp_path):
    # the stage started a child of its own (as verify starts its load probe) that holds the pipes
    code = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(20)']);"
        "print('partial résumé', flush=True); time.sleep(30)"
    )
    result = check.run_stage("sleeper", [sys.executable, "-c", code], 1.0, tmp_path / "sleeper.log")
    log = (tmp_path / "sleeper.log").read_text()
    assert result["rc"] == 124 and not result["ok"] and result["seconds"] < 10
    assert "partial résumé" in log and "(stopped after 1 s)" in log and "b'" not in log


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
    monkeypatch.setattr(check.time, "perf_counter", lambda: clock["now"])
    fake = SimpleNamespace(ran=[], seen_json=[], unloadable=False, failing=None, share=1.0)

    def stage(name, argv, limit, log):
        clock["now"] += fake.share * limit  # the share of its limit a stage takes
        fake.ran.append((name, argv, limit))
        fake.seen_json.append((log.parent / "device_check.json").is_file())
        if "build-engine" in argv and "-o" in argv:
            engine = Path(argv[argv.index("-o") + 1])
            engine.write_bytes(b"engine")
            manifest = {"load_check": {"ok": not fake.unloadable, "reason": None}}
            engine.with_name(engine.name + ".manifest.json").write_text(json.dumps(manifest))
        ok = not (fake.failing and fake.failing in name)
        log.write_text("log")
        return {"check": name, "rc": 0 if ok else 1, "ok": ok, "seconds": limit, "log": log.name, "tail": ""}

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
    summary = json.loads((tmp_path / "device_check.json").read_text())
    skipped = [c for c in summary["checks"] if c.get("skipped")]
    assert skipped and all(
        c["skipped"].startswith(("budget:", "PyTriton", "TensorRT", "fp8", "nvfp4")) for c in skipped
    )
    # stages that take a third of their limits: the Sudoku-size engine is built once and reused
    fake_gpu.ran.clear()
    fake_gpu.share = 0.33
    check.main([str(tmp_path / "fast"), "--no-diagnose"])
    names = [name for name, _, _ in fake_gpu.ran]
    sudoku = [n for n in names if "Sudoku-size" in n or "latency" in n]
    assert sudoku[:4] == [
        "Sudoku-size checkpoint (hidden 512, 16 ACT steps, random weights)",
        "build-engine --backend torch --bf16 (Sudoku-size, CUDA)",
        "verify (Sudoku-size bf16 engine vs its fp32 reference)",
        "latency: reference and step engine, captured loop, batch 1/64/1024, kernel time vs gaps",
    ]
    assert names.index(sudoku[3]) < names.index("pytest -m gpu")
    latency = next(argv for name, argv, _ in fake_gpu.ran if name.startswith("latency"))
    assert "--step-engine" in latency and "--profile" in latency  # the bf16 engine built once, reused
    assert latency[latency.index("--step-engine") + 1].endswith("sudoku-size.step.cuda.bf16.pt2")


def test_the_load_matrix_runs_first_when_diagnosing_or_after_a_failed_cli_load(check, fake_gpu, tmp_path):
    check.main([str(tmp_path / "a"), "--diagnose"])
    names = [name for name, _, _ in fake_gpu.ran]
    assert names[2] == "AOTInductor load matrix (max batch 1024)"
    matrix = fake_gpu.ran[2][1]
    assert matrix[1] == "scripts/aoti_load_matrix.py" and matrix[2].endswith("sudoku-small.step.cuda.pt2")
    assert "AOTInductor load matrix (max batch 256)" not in names or names.index(
        "AOTInductor load matrix (max batch 256)"
    ) > names.index("pytest -m gpu")  # the second engine only if time is left at the end
    # no --diagnose: a CLI load that fails (verify) brings the matrix in right after it
    fake_gpu.ran.clear()
    fake_gpu.failing = "verify (bundled engine"
    assert check.main([str(tmp_path / "b"), "--no-diagnose"]) == 1
    names = [name for name, _, _ in fake_gpu.ran]
    assert names[2:4] == [
        "verify (bundled engine on CUDA vs the PyTorch reference, fresh process)",
        "AOTInductor load matrix (max batch 1024)",
    ]
    # and so does a build whose own probe could not load its package in a fresh process
    fake_gpu.ran.clear()
    fake_gpu.failing, fake_gpu.unloadable = None, True
    check.main([str(tmp_path / "c"), "--no-diagnose"])
    assert [name for name, _, _ in fake_gpu.ran][2] == "AOTInductor load matrix (max batch 1024)"
    summary = json.loads((tmp_path / "c" / "device_check.json").read_text())
    assert summary["bundled_load_check"] == {"ok": False, "reason": None}


def test_kernel_time_against_gaps_per_act_step():
    latency = _load("gpu_latency", ROOT / "benchmarks" / "gpu_latency.py")
    kernels = [(0.0, 10.0), (5.0, 15.0), (20.0, 30.0)]  # microseconds; two overlap
    split = latency.split_gpu_time(kernels, [(30.0, 35.0)], wall_ms=0.05, steps=2)
    assert split["kernel_ms"] == pytest.approx(0.025) and split["copy_ms"] == pytest.approx(0.005)
    assert split["gap_ms"] == pytest.approx(0.005)  # 15..20 us: the GPU idle between kernels
    assert split["host_outside_gpu_ms"] == pytest.approx(0.015)
    assert split["per_step"] == {"kernel_ms": pytest.approx(0.0125), "gap_ms": pytest.approx(0.0025), "kernels": 1.5}
    assert latency.split_gpu_time([], [], 1.0, 16) == {"wall_ms": 1.0, "kernels_visible": False}


def test_a_profiled_call_without_gpu_activity_says_kernels_were_not_visible():
    torch = pytest.importorskip("torch")
    latency = _load("gpu_latency", ROOT / "benchmarks" / "gpu_latency.py")
    calls = []

    class Runner:
        def infer(self, feeds):
            calls.append(feeds)
            return {"logits": (torch.ones(8, 8) @ torch.ones(8, 8)).numpy()}

    split = latency.profile_call(Runner(), {"inputs": 1}, steps=16)
    assert len(calls) == 2 and split["kernels_visible"] is False and split["wall_ms"] > 0


@pytest.mark.slow
def test_gpu_latency_saves_its_model_and_refuses_to_measure_without_a_gpu(tmp_path):
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = [sys.executable, "benchmarks/gpu_latency.py"]
    saved = subprocess.run(
        [*script, "--save-checkpoint", str(tmp_path / "m.pt")], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert saved.returncode == 0 and (tmp_path / "m.pt").is_file(), saved.stderr
    out = tmp_path / "latency.json"
    refused = subprocess.run([*script, "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "no CUDA GPU" in refused.stderr and not out.exists()
