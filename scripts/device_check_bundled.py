"""The stages of scripts/device_check.sh (run that, not this): the user's path on a GPU, each step a
child process with its own time limit, so one that hangs or crashes costs only itself.

    python scripts/device_check.py [OUT] [--diagnose | --no-diagnose] [--budget SECONDS]

Stages, in priority order (a stage that no longer fits the budget is skipped with the reason):
held-out data; the bundled model's CUDA engine built once (its build probes the load in a fresh
process); the AOTInductor load matrix (scripts/aoti_load_matrix.py) while diagnosing, or when a
CLI load of that engine failed; verify, solve of a file, bench and serve (one request, where
PyTriton is installed) of that engine, each a fresh `hrm-deploy` process; a Sudoku-size model
(hidden 512, 16 ACT steps, random weights) built once in bf16 and verified against its reference;
latency of the reference and that step engine with the captured loop at batch 1, 64, 1024 (each
row written as soon as measured, with kernel time against launch gaps per ACT step from
torch.profiler); `pytest -m gpu`; then, if time is left: the load matrix on a max-batch-256 engine
of the bundled model (while diagnosing), TF32 and bf16 against exact fp32 on the bundled model,
the Sudoku-size model in fp32, FP8 / NVFP4 TensorRT engines. device_check.json / .md under OUT are rewritten after every stage, so a
run cut short keeps what it learned. Without a CUDA GPU: one line, exit 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
HRM = [PY, "-m", "hrm_deploy"]
BUNDLED = "hrm_deploy/train/presets/sudoku-small.pt"
PUZZLE = "175604839462893157893751642930517264624938715751206983089175426246389571517462390"
# One H100: a machine start plus a rerun must fit the 15-minute device budget.
TOTAL_BUDGET_S = 420.0
MIN_STAGE_S = 20.0
# The load matrix runs when the build's own load probe fails or a CLI load fails (or with
# --diagnose): a run measured the cause of the fresh-process crash (docs/gpu.md), so a run where the
# loader's fix holds spends its budget on the latency rows instead, and one where it does not
# bisects again.
DIAGNOSE_BY_DEFAULT = False


def text(data: str | bytes | None) -> str:
    """A child's output as text (TimeoutExpired carries bytes even with text=True)."""
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _tail(out: str, lines: int = 12) -> str:
    return "\n".join(out.strip().splitlines()[-lines:])


def run_stage(name: str, argv: list[str], limit: float, log: Path) -> dict:
    """Run one stage in a child with a time limit; its output (text) goes to ``log``."""
    start = time.perf_counter()
    env = dict(os.environ, PYTHONFAULTHANDLER="1")  # a crash in a child leaves its Python stack in the log
    # its own process group: at the limit the whole stage goes (a probe child or a server it
    # started would otherwise hold the pipes open and the check would wait for them)
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=limit)
        rc, out = proc.returncode, text(stdout) + text(stderr)
    except subprocess.TimeoutExpired as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        try:
            stdout, stderr = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a descendant left the group and holds the pipes
            stdout, stderr = exc.stdout, exc.stderr
        rc, out = 124, f"{text(stdout)}{text(stderr)}\n(stopped after {limit:.0f} s)"
    seconds = time.perf_counter() - start
    log.write_text(out)
    return {"check": name, "rc": rc, "ok": rc == 0, "seconds": round(seconds, 1), "log": log.name, "tail": _tail(out)}


def skipped(name: str, why: str) -> dict:
    return {"check": name, "rc": None, "ok": True, "skipped": why, "seconds": 0.0, "log": None, "tail": ""}


class Check:
    """The run's budget, its summary (rewritten after every stage) and the stage runner."""

    def __init__(self, out: Path, budget: float, summary: dict):
        self.out, self.budget, self.summary = out, budget, summary
        self.started = time.perf_counter()

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.started)

    def stage(self, name: str, argv: list[str], limit: float, log: str, minimum: float = MIN_STAGE_S) -> dict:
        """Run ``argv`` within ``min(limit, what is left)``; skipped when less than ``minimum`` is left."""
        left = self.left()
        if left < minimum:
            return self.record(skipped(name, f"budget: {max(left, 0):.0f} s of {self.budget:.0f} s left"))
        return self.record(run_stage(name, argv, min(limit, left), self.out / log))

    def record(self, result: dict) -> dict:
        self.summary["checks"].append(result)
        if result.get("skipped"):
            print(f"SKIP  {result['check']}  ({result['skipped']})", flush=True)
        else:
            print(f"{'PASS' if result['ok'] else 'FAIL'}  {result['check']}  ({result['seconds']} s)", flush=True)
            if not result["ok"]:
                print("      " + result["tail"].replace("\n", "\n      "), flush=True)
        self.write()
        return result

    def write(self) -> None:
        write_summary(self.out, self.summary)


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
                run_stage(
                    f"{name}, {flavour[1]}", ["bash", "-c", script], remaining, out / f"device_check_{precision}.log"
                )
            )
    return results


def verify_summary(engine: Path) -> dict | None:
    """The verify report's numbers (agreement, logits error, exact accuracy), or None without one."""
    report = engine.with_name(engine.name + ".verify.json")
    if not report.is_file():
        return None
    v = json.loads(report.read_text())
    return {
        "passed": v.get("passed"),
        "examples": v.get("examples"),
        "argmax_agreement": v["logits"]["argmax_agreement"],
        "logits_max_abs": v["logits"].get("max_abs"),
        "logits_max_rel": v["logits"].get("max_rel"),
        "exact": {
            "reference": v.get("reference", {}).get("exact_accuracy"),
            "candidate": v.get("candidate", {}).get("exact_accuracy"),
        },
        "failures": v.get("failures"),
    }


def load_check(engine: Path) -> dict | None:
    """The build's probe verdict (a fresh process loading the package), from the manifest."""
    manifest = engine.with_name(engine.name + ".manifest.json")
    return json.loads(manifest.read_text()).get("load_check") if manifest.is_file() else None


# the variants that decide the load crash (docs/gpu.md): without and with the AMX permission the
# loader now asks for, and with onnxruntime imported (which asks for it too), two runs each, at once
MATRIX_VARIANTS = "runner-extracted,runner-amx,runner-import-ort,tool-api,api-amx,hrm-runner,api-cli-imports"


def matrix_stage(check: Check, engine: Path, tag: str, limit: float) -> dict:
    argv = [PY, "scripts/aoti_load_matrix.py", str(engine), "--budget", str(int(max(limit - 10, 30)))]
    argv += ["--jobs", "8", "--repeat", "2", "--fast-first", "--only", MATRIX_VARIANTS]
    return check.stage(f"AOTInductor load matrix ({tag})", argv, limit, f"device_check_matrix_{tag}.log", 60.0)


def bundled_stages(check: Check, work: Path, data: Path, diagnose: bool) -> dict:
    """The bundled model's engine built once, then the matrix (when diagnosing) and the CLI stages."""
    engine = work / "sudoku-small.step.cuda.pt2"
    build = check.stage(
        "build-engine --backend torch (bundled model, CUDA, max batch 1024)",
        [*HRM, "build-engine", BUNDLED, "--backend", "torch", "-o", str(engine), "-q"],
        150,
        "device_check_build.log",
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
        "device_check_verify.log",
    )
    check.summary["verify"] = verify_summary(engine)
    if not verify["ok"] and not ran:  # a CLI load failed: the matrix says where
        matrix_stage(check, engine, "max batch 1024", 130)
        ran = True
    puzzles = work / "puzzles.txt"
    puzzles.write_text(f"{PUZZLE}\n{PUZZLE.replace('0', '.')}\n")
    check.stage(
        "solve a file (bundled engine, fresh process)",
        [*HRM, "solve", str(puzzles), str(engine), "--json"],
        60,
        "device_check_solve.log",
    )
    check.stage(
        "bench (bundled engine, batch 1 and 64, fresh process)",
        [*HRM, "bench", str(engine), "--data", str(data), "--batch", "1,64", "--iters", "10", "--no-reference"]
        + ["-o", str(work / "bench")],
        75,
        "device_check_bench.log",
    )
    if importlib.util.find_spec("pytriton") is None:
        check.record(skipped("serve one request (bundled engine)", "PyTriton is not installed"))
    else:
        check.stage(
            "serve one request (bundled engine)",
            [PY, "scripts/device_check.py", "--serve-one", str(engine)],
            120,
            "device_check_serve.log",
        )
    return {"engine": engine, "matrix_ran": ran}


def sudoku_size_stages(check: Check, work: Path, data: Path, precision: str, latency: bool) -> None:
    """The Sudoku-size model (random weights) built once in ``precision``: verify against its
    reference, then (``latency``) the latency rows with the same engine."""
    ckpt = work / "sudoku-size-random.pt"
    if not ckpt.is_file():
        made = check.stage(
            "Sudoku-size checkpoint (hidden 512, 16 ACT steps, random weights)",
            [PY, "benchmarks/gpu_latency.py", "--save-checkpoint", str(ckpt)],
            60,
            "device_check_sudoku_size.log",
        )
        if not made["ok"]:
            return
    engine = work / f"sudoku-size.step.cuda.{precision}.pt2"
    build = check.stage(
        f"build-engine --backend torch --{precision} (Sudoku-size, CUDA)",
        [*HRM, "build-engine", str(ckpt), "--backend", "torch", f"--{precision}", "-o", str(engine), "-q"],
        180,
        f"device_check_build_sudoku_size_{precision}.log",
        minimum=60.0,
    )
    if not build["ok"]:
        return
    # random weights: near-tied logits, so an argmax may flip in bf16; the numbers are recorded
    check.stage(
        f"verify (Sudoku-size {precision} engine vs its fp32 reference)",
        [*HRM, "verify", str(engine), "--data", str(data), "--samples", "64", "--min-agreement", "0.9"],
        90,
        f"device_check_verify_sudoku_size_{precision}.log",
    )
    check.summary[f"sudoku_size_{precision}_verify"] = verify_summary(engine)
    if latency:
        out = check.out / "gpu_latency.json"
        check.stage(
            "latency: reference and step engine, captured loop, batch 1/64/1024, kernel time vs gaps",
            [PY, "benchmarks/gpu_latency.py", "--checkpoint", str(ckpt), "--step-engine", str(engine)]
            + ["--iters", "40", "--seconds", "2", "--min-calls", "2", "--no-compiled-reference", "--profile"]
            + ["--out", str(out)],
            120,
            "device_check_latency.log",
            minimum=40.0,
        )
        if out.is_file():  # whatever rows were written, even when the stage was stopped
            rows = json.loads(out.read_text())["rows"]
            check.summary["gpu_latency"] = {
                r["name"]: {b: round(v["median_ms"], 3) for b, v in r["batches"].items()} for r in rows
            }


def precision_stages(check: Check, work: Path, data: Path) -> None:
    """TF32 and bf16 against exact fp32 on the bundled model (each verified against the fp32
    reference; the exact-fp32 engine's numbers are the CLI verify's)."""
    for flag, tag in (("--tf32", "fp32-tf32"), ("--bf16", "bf16")):
        engine = work / f"sudoku-small.step.cuda.{tag}.pt2"
        built = check.stage(
            f"build-engine --backend torch {flag} (bundled model)",
            [*HRM, "build-engine", BUNDLED, "--backend", "torch", flag, "--max-batch", "256", "-o", str(engine), "-q"],
            120,
            f"device_check_build_{tag}.log",
            minimum=60.0,
        )
        if built["ok"]:
            check.stage(
                f"verify {tag} (bundled model vs its fp32 reference)",
                [*HRM, "verify", str(engine), "--data", str(data), "--samples", "100"],
                120,
                f"device_check_verify_{tag}.log",
            )
            check.summary.setdefault("precision_accuracy", {})[tag] = verify_summary(engine)
    check.summary.setdefault("precision_accuracy", {})["fp32"] = check.summary.get("verify")


def pytest_stage(check: Check) -> None:
    argv = [PY, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors"]
    check.stage("pytest -m gpu", argv + ["-o", "addopts=-ra", "tests"], 200, "device_check_pytest.log", 60.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GPU device check (run scripts/device_check.sh)")
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
    summary: dict = {
        "what": "hrm-deploy GPU device check: the user's path (build once, then verify, solve, bench, serve "
        "from fresh processes), Sudoku-size bf16 engine, latency with kernel time vs gaps, pytest -m gpu",
        "gpu": torch.cuda.get_device_name(0),
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "budget_s": args.budget,
        "diagnose": args.diagnose,
        "checks": [],
    }
    check = Check(out, args.budget, summary)
    check.write()
    with tempfile.TemporaryDirectory() as tmp:
        work, data = Path(tmp), Path(tmp) / "data"
        gen = check.stage(
            "data sudoku (500 held-out puzzles of the bundled model's spec)",
            [*HRM, "data", "sudoku", "-o", str(data), "--train", "64", "--test", "500"]
            + ["--min-blanks", "10", "--max-blanks", "30", "--seed", "1"],
            30,
            "device_check_data.log",
        )
        if gen["ok"]:
            bundled = bundled_stages(check, work, data, args.diagnose)
            sudoku_size_stages(check, work, data, "bf16", latency=True)
        pytest_stage(check)
        if gen["ok"]:
            if args.diagnose and bundled["engine"] is not None:  # same model, smaller max batch: is it the bound?
                extra = work / "sudoku-small.step.cuda.b256.pt2"
                built = check.stage(
                    "build-engine --backend torch --max-batch 256 (bundled model, for the load matrix)",
                    [*HRM, "build-engine", BUNDLED, "--backend", "torch", "--max-batch", "256", "-o", str(extra), "-q"],
                    120,
                    "device_check_build_b256.log",
                    minimum=60.0,
                )
                if built["ok"]:
                    matrix_stage(check, extra, "max batch 256", 110)
            precision_stages(check, work, data)
            sudoku_size_stages(check, work, data, "fp32", latency=False)
            for result in reduced_precision_stages(work, data, out, summary["compute_capability"], check.left()):
                check.record(result)
    failed = [c["check"] for c in summary["checks"] if not c["ok"]]
    ran = [c for c in summary["checks"] if not c.get("skipped")]
    seconds = time.perf_counter() - check.started
    print(
        f"device check: {len(ran) - len(failed)} of {len(ran)} checks passed "
        f"({len(summary['checks']) - len(ran)} skipped) in {seconds:.0f} s"
    )
    return 1 if failed else 0


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


def write_summary(out: Path, summary: dict) -> None:
    """device_check.json and .md, written whole each time (a run cut short keeps what it learned)."""
    tmp = out / "device_check.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(out / "device_check.json")
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
    for key in ("bundled_load_check", "verify", "precision_accuracy", "sudoku_size_bf16_verify"):
        if summary.get(key) is not None:
            lines += ["", f"{key}: {json.dumps(summary[key])}"]
    (out / "device_check.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
