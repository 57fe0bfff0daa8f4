"""The GPU device check on a machine without a GPU: a clean no-op, and (with its stages faked) the
order of issue 6's plan within its 7-minute budget (the Sudoku-size build in the background first,
host facts, precision in process, the cause variants only where the build's probe died, latency
without the reference, verify, the in-flight test), its JSON after every stage, and the path each
row ran; the GPU latency and precision benchmarks' CPU-testable parts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.device_check_helpers import ROOT, load_benchmark, load_check


@pytest.fixture
def check(monkeypatch):
    return load_check("device_check", monkeypatch)


def test_without_a_gpu_the_check_says_so_in_one_line_and_exits_0(check, tmp_path, capsys):
    pytest.importorskip("torch")
    assert check.main([str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out == "no CUDA GPU: nothing to check\n"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("script", ["device_check.sh", "device_check_bundled.sh", "device_strip_refit.sh"])
def test_the_shell_entries_are_clean_no_ops_without_a_gpu(tmp_path, script):
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out")}
    done = subprocess.run(["bash", f"scripts/{script}"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "no CUDA GPU: nothing to check\n", "")
    assert not (tmp_path / "out").exists()


def test_the_stripped_engine_stage_without_tensorrt_is_a_clean_no_op(tmp_path, monkeypatch, capsys):
    strip = load_check("device_strip_refit", monkeypatch)
    assert strip.main([str(tmp_path / "out")]) == 0
    assert "nothing to check" in capsys.readouterr().out and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_stage_that_times_out_keeps_its_output_as_text_and_takes_its_children(check, tmp_path):
    # the stage started a child of its own (as verify starts its load probe) that holds the pipes
    code = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(20)']);"
        "print('partial résumé', flush=True); time.sleep(30)"
    )
    result = check.lib.run_stage("sleeper", [sys.executable, "-c", code], 1.0, tmp_path / "sleeper.log")
    log = (tmp_path / "sleeper.log").read_text()
    assert result["rc"] == 124 and not result["ok"] and result["seconds"] < 10
    assert "partial résumé" in log and "(stopped after 1 s)" in log and "b'" not in log


@pytest.mark.slow
def test_a_background_stage_is_stopped_at_its_limit_with_its_output(check, tmp_path):
    job = check.lib.Background(
        "bg",
        [sys.executable, "-c", "print('started', flush=True); import time; time.sleep(30)"],
        1.0,
        tmp_path / "bg.log",
    )
    result = job.wait(60)
    assert result["rc"] == 124 and "started" in (tmp_path / "bg.log").read_text() and result["seconds"] < 10


@pytest.fixture
def fake_gpu(check, monkeypatch):
    """A GPU as far as the check sees it; stages and the background build take ``share`` of their
    time limit on a fake clock (1.0: the worst case for the budget); the build leaves an engine
    and a manifest whose load_check says ``fake.probe_ok``; the benchmarks leave their JSON."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    clock = {"now": 0.0}
    monkeypatch.setattr(check.lib.time, "perf_counter", lambda: clock["now"])
    fake = SimpleNamespace(ran=[], seen_json=[], probe_ok=True, share=1.0, path="engine")

    def stage(name, argv, limit, log):
        clock["now"] += fake.share * limit
        fake.ran.append((name, argv, limit))
        fake.seen_json.append((log.parent / "device_check.json").is_file())
        if "--out" in argv:  # the benchmarks' JSON
            out = Path(argv[argv.index("--out") + 1])
            row = {"median_ms": 4.0, "puzzles_per_s": 250.0, "profile": {"per_step": {"kernel_ms": 0.2}}}
            body = {"rows": [{"name": "aoti_step", "path": fake.path, "batches": {"1": row}}]}
            if "gpu_precision.py" in argv[1]:
                body = {"rows": {"bf16": {"argmax_agreement": 0.99}}}
            out.write_text(json.dumps(body))
        log.write_text("running its exported program instead" if fake.path != "engine" else "log")
        return {"check": name, "rc": 0, "ok": True, "seconds": limit, "log": log.name, "tail": ""}

    class Build:
        def __init__(self, name, argv, limit, log):
            self.name, self.argv, self.limit = name, argv, limit
            fake.ran.append((name + " [started]", argv, limit))

        def wait(self, most):
            took = min(fake.share * self.limit, most)
            clock["now"] += took
            engine = Path(self.argv[-1].rsplit(" -o ", 1)[1].split()[0])
            engine.write_bytes(b"engine")
            manifest = {"load_check": {"ok": fake.probe_ok, "reason": None if fake.probe_ok else "SIGSEGV"}}
            engine.with_name(engine.name + ".manifest.json").write_text(json.dumps(manifest))
            fake.ran.append((self.name, self.argv, self.limit))
            return {"check": self.name, "rc": 0, "ok": True, "seconds": took, "log": "b.log", "tail": ""}

    monkeypatch.setattr(check.lib, "run_stage", stage)
    monkeypatch.setattr(check, "Background", Build)
    return fake


BUILD = "Sudoku-size data, checkpoint and bf16 step engine (background, max batch 1024)"
LATENCY = "latency: Sudoku-size bf16 step engine, captured loop, batch 1/64/1024, kernel time vs gaps"


def test_the_stages_run_in_the_plans_order_within_7_minutes(check, fake_gpu, tmp_path):
    fake_gpu.share = 0.5
    assert check.main([str(tmp_path)]) == 0
    names = [name for name, _, _ in fake_gpu.ran]
    assert names == [
        BUILD + " [started]",  # first, in the background
        "bf16 and TF32 vs exact fp32 (bundled model, in process, no compiles)",
        BUILD,
        LATENCY,  # no cause variants: the probe passed
        "verify (Sudoku-size bf16 engine vs its fp32 reference, 64 puzzles)",
        "pytest -m gpu: the in-flight step engine",
    ]
    build = fake_gpu.ran[0][1][-1]
    assert "--bf16" in build and "--max-batch 1024" in build and "benchmarks/gpu_latency.py --save-checkpoint" in build
    latency = dict((n, a) for n, a, _ in fake_gpu.ran)[LATENCY]
    assert "--no-reference" in latency and "--profile" in latency and latency[-1].endswith("gpu_latency.json")
    assert latency[latency.index("--step-engine") + 1].endswith("sudoku-size.step.cuda.bf16.pt2")
    assert latency[latency.index("--batches") + 1 : latency.index("--batches") + 4] == ["1", "64", "1024"]
    summary = json.loads((tmp_path / "device_check.json").read_text())
    checks = [c["check"] for c in summary["checks"]]
    assert checks[0] == "host facts" and "load matrix, cause variants" in checks  # skipped, with the reason
    assert summary["host"]["cpu"]["flags_digest"] and summary["load_check"]["ok"] is True
    assert summary["gpu_latency"]["aoti_step"]["path"] == "engine" and summary["verify_path"] == "engine"
    assert summary["precision_accuracy"] == {"bf16": {"argmax_agreement": 0.99}}
    assert all(fake_gpu.seen_json)  # the JSON existed before every stage
    assert "(engine)" in (tmp_path / "device_check.md").read_text()


def test_the_budget_holds_when_every_stage_takes_its_whole_limit(check, fake_gpu, tmp_path):
    fake_gpu.probe_ok = False  # the most work: the cause variants too
    check.main([str(tmp_path)])
    ran = [(n, limit) for n, _, limit in fake_gpu.ran if not n.endswith("[started]")]
    assert sum(limit for _, limit in ran) <= check.TOTAL_BUDGET_S == 420.0
    summary = json.loads((tmp_path / "device_check.json").read_text())
    assert [c for c in summary["checks"] if c.get("skipped", "").startswith("budget:")]  # the tail is skipped


def test_the_cause_variants_run_only_where_the_builds_probe_died(check, fake_gpu, tmp_path):
    fake_gpu.share, fake_gpu.probe_ok, fake_gpu.path = 0.3, False, "fallback (eager)"
    check.main([str(tmp_path)])
    names = [name for name, _, _ in fake_gpu.ran]
    assert names.index(BUILD) + 1 == names.index("load matrix, cause variants (Sudoku-size bf16 engine)")
    matrix = dict((n, a) for n, a, _ in fake_gpu.ran)["load matrix, cause variants (Sudoku-size bf16 engine)"]
    assert matrix[1] == "scripts/diagnostics/2026-11-aoti-load/aoti_load_matrix.py"
    assert {"--cause", "--ort-libs", "--fault-report"} <= set(matrix) and matrix[matrix.index("--repeat") + 1] == "2"
    summary = json.loads((tmp_path / "device_check.json").read_text())
    assert summary["load_check"] == {"ok": False, "reason": "SIGSEGV"}
    assert summary["gpu_latency"]["aoti_step"]["path"] == "fallback (eager)"
    assert summary["verify_path"] == "fallback (exported program)"
    fake_gpu.ran.clear()
    fake_gpu.probe_ok = True  # --diagnose runs them anyway
    check.main([str(tmp_path / "d"), "--diagnose"])
    assert "load matrix, cause variants (Sudoku-size bf16 engine)" in [n for n, _, _ in fake_gpu.ran]


def test_kernel_time_against_gaps_per_act_step():
    latency = load_benchmark("gpu_latency")
    kernels = [(0.0, 10.0), (5.0, 15.0), (20.0, 30.0)]  # microseconds; two overlap
    split = latency.split_gpu_time(kernels, [(30.0, 35.0)], wall_ms=0.05, steps=2)
    assert split["kernel_ms"] == pytest.approx(0.025) and split["copy_ms"] == pytest.approx(0.005)
    assert split["gap_ms"] == pytest.approx(0.005)  # 15..20 us: the GPU idle between kernels
    assert split["host_outside_gpu_ms"] == pytest.approx(0.015)
    assert split["per_step"] == {"kernel_ms": pytest.approx(0.0125), "gap_ms": pytest.approx(0.0025), "kernels": 1.5}
    assert latency.split_gpu_time([], [], 1.0, 16) == {"wall_ms": 1.0, "kernels_visible": False}


def test_a_profiled_call_without_gpu_activity_says_kernels_were_not_visible():
    torch = pytest.importorskip("torch")
    latency = load_benchmark("gpu_latency")
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


@pytest.mark.slow
def test_gpu_precision_on_the_cpu_compares_bf16_and_tf32_with_exact_fp32(tmp_path):
    pytest.importorskip("torch")
    precision = load_benchmark("gpu_precision")
    out = tmp_path / "p.json"
    assert precision.main(["--device", "cpu", "--samples", "8", "--batch", "4", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"fp32", "fp32-tf32", "bf16"}
    assert rows["fp32"]["argmax_agreement"] == 1.0 and rows["fp32"]["logits_max_abs"] == 0.0
    assert rows["fp32-tf32"]["logits_max_abs"] == 0.0  # TF32 changes CUDA matmuls only
    assert 0.5 < rows["bf16"]["argmax_agreement"] <= 1.0 and rows["bf16"]["logits_max_abs"] > 0.0
