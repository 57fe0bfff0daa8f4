"""The stages of scripts/device_check.sh (run that, not this): one call of at most 7 minutes that
spends the device's minutes on what is not known yet, each step a child process with its own time
limit, so one that hangs or crashes costs only itself.

    python scripts/device_check.py [OUT] [--diagnose] [--budget SECONDS]

In this order (a stage that no longer fits the budget is skipped with the reason):
1. in the background, at once: held-out Sudoku data, the Sudoku-size checkpoint (hidden 512, 16
   ACT steps, random weights) and its bf16 step engine (max batch 1024; the build probes the load
   in a fresh process: batch 1, the max batch, a CUDA graph capture and replay);
2. host facts: CPU model and flags, the AMX permission mask, driver, torch, CUDA, GPU;
3. bf16 and TF32 against exact fp32 on the trained bundled model, in process (no compiles:
   benchmarks/gpu_precision.py);
4. the build finished: its load probe's verdict (`load_check`); only where the probe died (or with
   --diagnose), the load matrix's cause variants (scripts/diagnostics/2026-11-aoti-load: control,
   the AMX permission before / after CUDA initialisation, onnxruntime's import, each library that
   import maps; twice each, with the fault report);
5. latency of that engine (benchmarks/gpu_latency.py) at batch 1, 64, 1024 on the captured loop,
   with the kernel/gap breakdown per ACT step, without the eager reference (its numbers are
   recorded in docs/gpu.md);
6. verify of that engine on 64 puzzles against its fp32 reference;
7. if time is left: the in-flight engine test (pytest -m gpu tests/backends/torch/test_torch_inflight.py).
Every row says which path ran: the AOTInductor engine or its fallback (the exported program).
device_check.json / .md under OUT are rewritten after every stage, so a run cut short keeps what
it learned. The bundled model's build/verify/solve/bench/serve are scripts/device_check_bundled.sh.
Without a CUDA GPU: one line, exit 0.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_check_lib import (  # noqa: E402 - the scripts folder is not a package
    HRM,
    PY,
    TOTAL_BUDGET_S,
    Background,
    Check,
    finish,
    load_check,
    new_summary,
    path_ran,
    skipped,
    verify_summary,
)

MATRIX = "scripts/diagnostics/2026-11-aoti-load/aoti_load_matrix.py"
BUILD_LIMIT_S = (
    240.0  # data + checkpoint + AOTInductor compile of the Sudoku-size step (~100-115 s on an H100 host) + probe
)


def background_build(work: Path, out: Path) -> tuple[Background, Path, Path, Path]:
    """Start data, checkpoint and the bf16 step engine's build, chained, in the background."""
    data, ckpt = work / "data", work / "sudoku-size-random.pt"
    engine = work / "sudoku-size.step.cuda.bf16.pt2"
    steps = [
        [*HRM, "data", "sudoku", "-o", str(data), "--train", "8", "--test", "128", "--seed", "1"],
        [PY, "benchmarks/gpu_latency.py", "--save-checkpoint", str(ckpt)],
        [*HRM, "build-engine", str(ckpt), "--backend", "torch", "--bf16", "--max-batch", "1024", "-o", str(engine)],
    ]
    script = " && ".join(subprocess.list2cmdline(step) for step in steps)
    name = "Sudoku-size data, checkpoint and bf16 step engine (background, max batch 1024)"
    job = Background(name, ["bash", "-c", script], BUILD_LIMIT_S, out / "device_check_build.log")
    return job, data, ckpt, engine


def host_facts() -> dict:
    """CPU model, flags digest and ISA flags, the AMX permission mask, driver, torch, CUDA, GPU."""
    import torch

    from hrm_deploy.backends.torch.host import amx_permitted, cpu_identity, driver_version, xcomp_permission_mask

    mask = xcomp_permission_mask()
    return {
        "cpu": cpu_identity(),
        "xcomp_mask": None if mask is None else hex(mask),
        "amx_permitted": amx_permitted(mask),
        "driver": driver_version(),
        "gpu": torch.cuda.get_device_name(0),
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def precision_stage(check: Check) -> None:
    out = check.out / "gpu_precision.json"
    argv = [PY, "benchmarks/gpu_precision.py", "--samples", "256", "--out", str(out)]
    check.stage(
        "bf16 and TF32 vs exact fp32 (bundled model, in process, no compiles)", argv, 90, "device_check_precision.log"
    )
    if out.is_file():
        check.summary["precision_accuracy"] = json.loads(out.read_text())["rows"]


def cause_stage(check: Check, engine: Path, diagnose: bool) -> None:
    """The cause variants, where the build's probe died (or diagnosing)."""
    verdict = check.summary.get("load_check") or {}
    if verdict.get("ok", False) and not diagnose:
        check.record(skipped("load matrix, cause variants", "the build's load probe passed"))
        return
    argv = [PY, MATRIX, str(engine), "--budget", "110", "--jobs", "8", "--repeat", "2"]
    argv += ["--cause", "--ort-libs", "--fault-report"]
    check.stage("load matrix, cause variants (Sudoku-size bf16 engine)", argv, 120, "device_check_matrix.log", 60.0)


def latency_stage(check: Check, ckpt: Path, engine: Path) -> None:
    out = check.out / "gpu_latency.json"
    argv = [PY, "benchmarks/gpu_latency.py", "--checkpoint", str(ckpt), "--step-engine", str(engine)]
    argv += ["--no-reference", "--profile", "--batches", "1", "64", "1024", "--iters", "40", "--seconds", "2"]
    argv += ["--min-calls", "2", "--out", str(out)]
    name = "latency: Sudoku-size bf16 step engine, captured loop, batch 1/64/1024, kernel time vs gaps"
    check.stage(name, argv, 120, "device_check_latency.log", 40.0)
    if out.is_file():  # whatever rows were written, even when the stage was stopped
        check.summary["gpu_latency"] = {
            r["name"]: {
                "path": r.get("path"),
                "median_ms": {b: round(v["median_ms"], 3) for b, v in r["batches"].items()},
                "puzzles_per_s": {b: round(v["puzzles_per_s"], 1) for b, v in r["batches"].items()},
                "per_step": {b: v.get("profile", {}).get("per_step") for b, v in r["batches"].items()},
            }
            for r in json.loads(out.read_text())["rows"]
        }


def verify_stage(check: Check, data: Path, engine: Path) -> None:
    # random weights: near-tied logits, so an argmax may flip in bf16; the numbers are recorded
    argv = [*HRM, "verify", str(engine), "--data", str(data), "--samples", "64", "--min-agreement", "0.9"]
    check.stage(
        "verify (Sudoku-size bf16 engine vs its fp32 reference, 64 puzzles)", argv, 90, "device_check_verify.log"
    )
    check.summary["sudoku_size_bf16_verify"] = verify_summary(engine)
    check.summary["verify_path"] = path_ran(check.out / "device_check_verify.log")


def inflight_stage(check: Check) -> None:
    argv = [PY, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra"]
    argv += ["tests/backends/torch/test_torch_inflight.py"]
    check.stage("pytest -m gpu: the in-flight step engine", argv, 150, "device_check_inflight.log", 60.0)


def run(check: Check, work: Path, diagnose: bool) -> None:
    """The stages in their order (see the module docstring)."""
    job, data, ckpt, engine = background_build(work, check.out)
    check.summary["host"] = host_facts()
    check.record({"check": "host facts", "rc": 0, "ok": True, "seconds": 0.0, "log": None, "tail": ""})
    precision_stage(check)
    built = check.record(job.wait(max(check.left(), 0.0)))
    check.summary["load_check"] = load_check(engine)
    check.write()
    if not built["ok"] or not engine.is_file():
        return
    cause_stage(check, engine, diagnose)
    latency_stage(check, ckpt, engine)
    verify_stage(check, data, engine)
    inflight_stage(check)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GPU device check (run scripts/device_check.sh)")
    parser.add_argument("out", nargs="?", default="benchmarks/results")
    parser.add_argument("--diagnose", action="store_true", help="run the cause variants even where the probe passed")
    parser.add_argument("--budget", type=float, default=TOTAL_BUDGET_S, help="seconds for every stage together")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    what = (
        "hrm-deploy GPU device check: Sudoku-size bf16 step engine (probe verdict, latency 1/64/1024 with "
        "kernel/gap breakdown, verify), bf16/TF32 vs fp32, the load crash's cause where the probe died"
    )
    summary = new_summary(torch, what, args.budget)
    check = Check(out, args.budget, summary)
    check.write()
    with tempfile.TemporaryDirectory() as tmp:
        run(check, Path(tmp), args.diagnose)
    return finish(check, "device check")


if __name__ == "__main__":
    sys.exit(main())
