"""The stages of scripts/device_check.sh (run that, not this): each stage is a child process with
its own time limit, so one that hangs or crashes costs only itself; one line per check; the
summary (device_check.json / .md) is rewritten after every stage, so a run cut short keeps
what it learned."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
BUNDLED = "hrm_deploy/train/presets/sudoku-small.pt"
# The stages' limits add up to this; the FP8/NVFP4 engine stages (last, and only where TensorRT and
# the GPU's compute capability allow them) get what the earlier stages left of it.
TOTAL_BUDGET_S = 710.0
MIN_STAGE_S = 60.0


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_stage(name: str, argv: list[str], limit: float, log: Path) -> dict:
    start = time.perf_counter()
    env = dict(os.environ, PYTHONFAULTHANDLER="1")  # a crash in a child leaves its Python stack in the log
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=limit, env=env)
        rc, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = 124, f"{exc.stdout or ''}{exc.stderr or ''}\n(stopped after {limit:.0f} s)"
        out = out if isinstance(out, str) else out.decode(errors="replace")
    seconds = time.perf_counter() - start
    log.write_text(out)
    return {"check": name, "rc": rc, "ok": rc == 0, "seconds": round(seconds, 1), "log": log.name, "tail": _tail(out)}


def skipped(name: str, why: str) -> dict:
    return {"check": name, "rc": None, "ok": True, "skipped": why, "seconds": 0.0, "log": None, "tail": ""}


def tensorrt_flavour() -> tuple[list[str], str] | None:
    """How to build for this machine's GPU: (build-engine options, description), or None without
    TensorRT. TensorRT builds for the GPU it runs on (datacenter target); TensorRT-RTX is told it."""
    import importlib.util

    import torch

    if importlib.util.find_spec("tensorrt") is not None and hasattr(__import__("tensorrt"), "Builder"):
        return ["--target", "datacenter"], "TensorRT"
    if importlib.util.find_spec("tensorrt_rtx") is not None:
        sm = "SM{}{}".format(*torch.cuda.get_device_capability(0))
        return ["--target", "desktop", "--compute-capability", sm], f"TensorRT-RTX for {sm}"
    return None


def reduced_precision_stages(work: Path, data: Path, out: Path, capability: str, left: float) -> list[dict]:
    """FP8 and NVFP4 engines of the bundled model, built and verified on this GPU; each skipped
    with its reason where the GPU's compute capability or TensorRT does not allow it."""
    from hrm_deploy.engines.targets import MIN_CAPABILITY, parse_capability

    results, start = [], time.perf_counter()
    flavour = tensorrt_flavour()
    onnx = work / "sudoku-small.onnx"
    for precision in ("fp8", "nvfp4"):
        name = f"build-engine --{precision} + verify (bundled model)"
        need = MIN_CAPABILITY[precision]
        remaining = left - (time.perf_counter() - start)
        if parse_capability(capability) < need:
            results.append(
                skipped(name, f"{precision} needs compute capability >= {need[0]}.{need[1]}; this GPU is {capability}")
            )
        elif flavour is None:
            results.append(skipped(name, "TensorRT (tensorrt or tensorrt_rtx) is not installed"))
        elif remaining < MIN_STAGE_S:
            results.append(skipped(name, f"only {remaining:.0f} s of the {TOTAL_BUDGET_S:.0f} s budget left"))
        else:
            engine = work / f"sudoku-small.{precision}.engine"
            argv = [PY, "-m", "hrm_deploy"]
            steps = [] if onnx.is_file() else [[*argv, "export", BUNDLED, "-o", str(onnx), "--no-parity", "-q"]]
            steps += [
                [*argv, "build-engine", str(onnx), "--precision", precision, *flavour[0], "--calib-data", str(data)]
                + ["-o", str(engine), "-q"],
                [*argv, "verify", str(engine), "--data", str(data), "--samples", "200"],
            ]
            script = " && ".join(subprocess.list2cmdline(step) for step in steps)
            results.append(
                run_stage(
                    f"{name}, {flavour[1]}", ["bash", "-c", script], remaining, out / f"device_check_{precision}.log"
                )
            )
    return results


def main() -> int:
    started = time.perf_counter()
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results")
    out.mkdir(parents=True, exist_ok=True)
    import torch

    summary: dict = {
        "what": "hrm-deploy GPU device check: GPU tests, GPU latency, verify of an AOTInductor engine on CUDA, "
        "FP8 / NVFP4 TensorRT engines where the GPU and TensorRT allow",
        "gpu": torch.cuda.get_device_name(0),
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "checks": [],
    }

    def record(result: dict) -> None:
        summary["checks"].append(result)
        if result.get("skipped"):
            print(f"SKIP  {result['check']}  ({result['skipped']})", flush=True)
            _write(out, summary)
            return
        print(f"{'PASS' if result['ok'] else 'FAIL'}  {result['check']}  ({result['seconds']} s)", flush=True)
        if not result["ok"]:
            print("      " + result["tail"].replace("\n", "\n      "), flush=True)
        _write(out, summary)

    record(
        run_stage(
            "pytest -m gpu",
            [
                PY,
                "-m",
                "pytest",
                "-m",
                "gpu",
                "-q",
                "-p",
                "no:cacheprovider",
                "--continue-on-collection-errors",
                "-o",
                "addopts=-ra",
                "tests",
            ],
            170,
            out / "device_check_pytest.log",
        )
    )
    with tempfile.TemporaryDirectory() as tmp:
        data, engine = Path(tmp) / "data", Path(tmp) / "sudoku-small.step.cuda.pt2"
        gen = run_stage(
            "data sudoku (500 held-out puzzles of the bundled model's spec)",
            [
                PY,
                "-m",
                "hrm_deploy",
                "data",
                "sudoku",
                "-o",
                str(data),
                "--train",
                "64",
                "--test",
                "500",
                "--min-blanks",
                "10",
                "--max-blanks",
                "30",
                "--seed",
                "1",
            ],
            30,
            out / "device_check_data.log",
        )
        build = (
            run_stage(
                "build-engine --backend torch (bundled model, CUDA)",
                [PY, "-m", "hrm_deploy", "build-engine", BUNDLED, "--backend", "torch", "-o", str(engine), "-q"],
                120,
                out / "device_check_build.log",
            )
            if gen["ok"]
            else gen
        )
        record(build)
        if build["ok"]:
            result = run_stage(
                "verify (AOTInductor engine of the bundled model on CUDA vs the PyTorch reference)",
                [PY, "-m", "hrm_deploy", "verify", str(engine), "--data", str(data), "--samples", "200"],
                150,  # the reference runs on the CPU
                out / "device_check_verify.log",
            )
            report = engine.with_name(engine.name + ".verify.json")
            if report.is_file():
                v = json.loads(report.read_text())
                summary["verify"] = {k: v.get(k) for k in ("passed", "runtime", "examples", "failures")}
                summary["verify"]["argmax_agreement"] = v["logits"]["argmax_agreement"]
                summary["verify"]["exact"] = {
                    "reference": v.get("reference", {}).get("exact_accuracy"),
                    "candidate": v.get("candidate", {}).get("exact_accuracy"),
                }
            record(result)
        if gen["ok"]:
            left = TOTAL_BUDGET_S - (time.perf_counter() - started) - 240  # the latency stage's limit comes after
            for result in reduced_precision_stages(Path(tmp), data, out, summary["compute_capability"], left):
                record(result)
    latency = out / "gpu_latency.json"
    record(
        run_stage(
            "benchmarks/gpu_latency.py (reference, AOTInductor step engine; batch 1, 64, 1024)",
            [
                PY,
                "benchmarks/gpu_latency.py",
                "--no-compiled-reference",
                "--iters",
                "40",
                "--seconds",
                "2",
                "--out",
                str(latency),
            ],
            240,
            out / "device_check_latency.log",
        )
    )
    if latency.is_file():
        summary["gpu_latency"] = {
            r["name"]: {b: round(v["median_ms"], 3) for b, v in r["batches"].items()}
            for r in json.loads(latency.read_text())["rows"]
        }
    _write(out, summary)
    failed = [c["check"] for c in summary["checks"] if not c["ok"]]
    ran = [c for c in summary["checks"] if not c.get("skipped")]
    print(
        f"device check: {len(ran) - len(failed)} of {len(ran)} checks passed ({len(summary['checks']) - len(ran)} skipped)"
    )
    return 1 if failed else 0


def _write(out: Path, summary: dict) -> None:
    (out / "device_check.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [f"# GPU device check: {summary['gpu']} (sm {summary['compute_capability']}), torch {summary['torch']}", ""]
    lines += ["| check | result | seconds |", "|---|---|---|"]
    lines += [
        f"| {c['check']} | {'skipped: ' + c['skipped'] if c.get('skipped') else 'pass' if c['ok'] else 'FAIL'} "
        f"| {c['seconds']} |"
        for c in summary["checks"]
    ]
    if "gpu_latency" in summary:
        lines += ["", "Median latency per call (ms), batch 1 / 64 / 1024:", ""]
        lines += [f"- {name}: {' / '.join(str(v) for v in b.values())}" for name, b in summary["gpu_latency"].items()]
    if "verify" in summary:
        lines += ["", f"verify: {json.dumps(summary['verify'])}"]
    (out / "device_check.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
