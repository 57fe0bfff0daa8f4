"""The stages of scripts/device_check_bundled.sh (run that, not this): the second, optional GPU
check, after scripts/device_check.sh: the user's path with the bundled model, each step a child
process with its own time limit, so one that hangs or crashes costs only itself.

    python scripts/device_check_bundled.py [OUT] [--diagnose | --no-diagnose] [--budget SECONDS]

Stages, in priority order (a stage that no longer fits the budget is skipped with the reason):
held-out data; the bundled model's CUDA engine built once (its build probes the load in a fresh
process); the cause variants of the load matrix (scripts/diagnostics/2026-11-aoti-load) while
diagnosing, or when the build's probe or a CLI load of that engine failed; verify, solve of a file,
bench and serve (one request, where PyTriton is installed) of that engine, each a fresh
`hrm-deploy` process; `pytest -m gpu`; then, if time is left: TF32 and bf16 engines of the bundled
model against its fp32 reference, FP8 / NVFP4 TensorRT engines. device_check_bundled.json / .md
under OUT are rewritten after every stage. Without a CUDA GPU: one line, exit 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_check_lib import (  # noqa: E402 - the scripts folder is not a package
    BUNDLED,
    DIAGNOSE_BY_DEFAULT,
    HRM,
    PUZZLE,
    PY,
    TOTAL_BUDGET_S,
    Check,
    _tail,
    finish,
    load_check,
    new_summary,
    path_ran,
    run_stage,
    skipped,
    text,
    verify_summary,
)

MATRIX = "scripts/diagnostics/2026-11-aoti-load/aoti_load_matrix.py"
STEM = "device_check_bundled"


def tensorrt_flavour() -> tuple[list[str], str] | None:
    """How to build for this machine's GPU: (build-engine options, description), or None without
    TensorRT. TensorRT builds for the GPU it runs on (datacenter target); TensorRT-RTX is told it."""
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
        elif remaining < 60.0:
            results.append(skipped(name, f"only {remaining:.0f} s of the budget left"))
        else:
            engine = work / f"sudoku-small.{precision}.engine"
            steps = [] if onnx.is_file() else [[*HRM, "export", BUNDLED, "-o", str(onnx), "--no-parity", "-q"]]
            steps += [
                [*HRM, "build-engine", str(onnx), "--precision", precision, *flavour[0], "--calib-data", str(data)]
                + ["-o", str(engine), "-q"],
                [*HRM, "verify", str(engine), "--data", str(data), "--samples", "200"],
            ]
            script = " && ".join(subprocess.list2cmdline(step) for step in steps)
            results.append(
                run_stage(f"{name}, {flavour[1]}", ["bash", "-c", script], remaining, out / f"{STEM}_{precision}.log")
            )
    return results


def matrix_stage(check: Check, engine: Path, tag: str, limit: float) -> dict:
    """The cause variants of the load matrix, twice each, at once, with the fault report."""
    argv = [PY, MATRIX, str(engine), "--budget", str(int(max(limit - 10, 30))), "--jobs", "8", "--repeat", "2"]
    argv += ["--cause", "--ort-libs", "--fault-report"]
    return check.stage(f"AOTInductor load matrix, cause variants ({tag})", argv, limit, f"{STEM}_matrix.log", 60.0)


def bundled_stages(check: Check, work: Path, data: Path, diagnose: bool) -> dict:
    """The bundled model's engine built once, then the matrix (when diagnosing) and the CLI stages."""
    engine = work / "sudoku-small.step.cuda.pt2"
    build = check.stage(
        "build-engine --backend torch (bundled model, CUDA, max batch 1024)",
        [*HRM, "build-engine", BUNDLED, "--backend", "torch", "-o", str(engine), "-q"],
        150,
        f"{STEM}_build.log",
    )
    check.summary["bundled_load_check"] = load_check(engine)
    if not build["ok"] or not engine.is_file():
        return {"engine": None, "matrix_ran": False}
    loadable = (check.summary["bundled_load_check"] or {}).get("ok", True)
    ran = diagnose or not loadable
    if ran:  # first, while the crash stands (or the build's own probe could not load it)
        matrix_stage(check, engine, "max batch 1024", 130)
    verify = check.stage(
        "verify (bundled engine on CUDA vs the PyTorch reference, fresh process)",
        [*HRM, "verify", str(engine), "--data", str(data), "--samples", "100"],
        120,  # its reference runs on the CPU (200 samples did not finish in 60 s on an H100 machine)
        f"{STEM}_verify.log",
    )
    check.summary["verify"] = verify_summary(engine)
    check.summary["verify_path"] = path_ran(check.out / f"{STEM}_verify.log")
    if not verify["ok"] and not ran:  # a CLI load failed: the matrix says where
        matrix_stage(check, engine, "max batch 1024", 130)
        ran = True
    puzzles = work / "puzzles.txt"
    puzzles.write_text(f"{PUZZLE}\n{PUZZLE.replace('0', '.')}\n")
    check.stage(
        "solve a file (bundled engine, fresh process)",
        [*HRM, "solve", str(puzzles), str(engine), "--json"],
        60,
        f"{STEM}_solve.log",
    )
    check.stage(
        "bench (bundled engine, batch 1 and 64, fresh process)",
        [*HRM, "bench", str(engine), "--data", str(data), "--batch", "1,64", "--iters", "10", "--no-reference"]
        + ["-o", str(work / "bench")],
        75,
        f"{STEM}_bench.log",
    )
    if importlib.util.find_spec("pytriton") is None:
        check.record(skipped("serve one request (bundled engine)", "PyTriton is not installed"))
    else:
        check.stage(
            "serve one request (bundled engine)",
            [PY, "scripts/device_check_bundled.py", "--serve-one", str(engine)],
            120,
            f"{STEM}_serve.log",
        )
    return {"engine": engine, "matrix_ran": ran}


def precision_stages(check: Check, work: Path, data: Path) -> None:
    """TF32 and bf16 against exact fp32 on the bundled model (each verified against the fp32
    reference; the exact-fp32 engine's numbers are the CLI verify's)."""
    for flag, tag in (("--tf32", "fp32-tf32"), ("--bf16", "bf16")):
        engine = work / f"sudoku-small.step.cuda.{tag}.pt2"
        built = check.stage(
            f"build-engine --backend torch {flag} (bundled model)",
            [*HRM, "build-engine", BUNDLED, "--backend", "torch", flag, "--max-batch", "256", "-o", str(engine), "-q"],
            120,
            f"{STEM}_build_{tag}.log",
            minimum=60.0,
        )
        if built["ok"]:
            check.stage(
                f"verify {tag} (bundled model vs its fp32 reference)",
                [*HRM, "verify", str(engine), "--data", str(data), "--samples", "100"],
                120,
                f"{STEM}_verify_{tag}.log",
            )
            check.summary.setdefault("precision_accuracy", {})[tag] = verify_summary(engine)
    check.summary.setdefault("precision_accuracy", {})["fp32"] = check.summary.get("verify")


def pytest_stage(check: Check) -> None:
    argv = [PY, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors"]
    check.stage("pytest -m gpu", argv + ["-o", "addopts=-ra", "tests"], 200, f"{STEM}_pytest.log", 60.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="bundled-model GPU check (run scripts/device_check_bundled.sh)")
    parser.add_argument("out", nargs="?", default="benchmarks/results")
    parser.add_argument("--diagnose", dest="diagnose", action="store_true", default=DIAGNOSE_BY_DEFAULT)
    parser.add_argument("--no-diagnose", dest="diagnose", action="store_false")
    parser.add_argument("--budget", type=float, default=TOTAL_BUDGET_S, help="seconds for every stage together")
    parser.add_argument("--serve-one", default=None, help=argparse.SUPPRESS)  # the serve stage's child
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to check")
        return 0
    if args.serve_one:
        return serve_one(Path(args.serve_one))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    what = (
        "hrm-deploy bundled-model GPU check: the user's path (build once, then verify, solve, bench, "
        "serve from fresh processes), pytest -m gpu, TF32/bf16 engines, FP8/NVFP4 where TensorRT allows"
    )
    summary = new_summary(torch, what, args.budget, diagnose=args.diagnose)
    check = Check(out, args.budget, summary, STEM)
    check.write()
    with tempfile.TemporaryDirectory() as tmp:
        work, data = Path(tmp), Path(tmp) / "data"
        gen = check.stage(
            "data sudoku (500 held-out puzzles of the bundled model's spec)",
            [*HRM, "data", "sudoku", "-o", str(data), "--train", "64", "--test", "500"]
            + ["--min-blanks", "10", "--max-blanks", "30", "--seed", "1"],
            30,
            f"{STEM}_data.log",
        )
        if gen["ok"]:
            bundled_stages(check, work, data, args.diagnose)
        pytest_stage(check)
        if gen["ok"]:
            precision_stages(check, work, data)
            for result in reduced_precision_stages(work, data, out, summary["compute_capability"], check.left()):
                check.record(result)
    return finish(check, "bundled device check")


def serve_one(engine: Path) -> int:
    """The serve stage's child: `hrm-deploy serve ENGINE` on free ports, one solve request over
    HTTP, then a clean stop. Exit 0 when the answer came back."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.serve.helpers import ServeProcess

    log = Path(tempfile.mkdtemp(prefix="hrm-serve-")) / "serve.log"
    server = ServeProcess(engine, log)
    try:
        server.wait_ready(timeout_s=90)
        done = subprocess.run([*HRM, "solve", PUZZLE, "--url", server.url, "--json"], capture_output=True, text=True)
        print(text(done.stdout) + text(done.stderr))
        return 0 if done.returncode == 0 and '"answer"' in text(done.stdout) else 1
    finally:
        if server.proc.poll() is None:
            server.stop()
        print(_tail(log.read_text(), 20))


if __name__ == "__main__":
    sys.exit(main())
