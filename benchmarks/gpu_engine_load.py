"""Fresh-process load time of a PyTorch engine (``.pt2``): where a new process spends its time
before the first inference, and ``verify`` of the engine against ``verify`` of its ONNX.

Every row is a new process (median of ``--repeats``), so nothing is warm but what the row says:
- ``torch-wrapper``: ``torch._inductor.aoti_load_package`` (torch's Python loader, which compiles
  and loads instruction-set test programs first), with an empty Inductor cache (a new machine,
  container or user) and with a warm one;
- ``hrm-deploy-loader``: :func:`hrm_deploy.backends.torch.package.load_aoti_package` (torch's C++
  loader, the call spec parsed once) with an empty Inductor cache;
- ``runner-ready``: from the process's start to an active runner (``open_runner`` + activate: the
  probe verdict read from the cache, or, ``uncached``, a probe child first), i.e. what ``verify``,
  ``solve`` or ``bench`` pay before their first inference;
- ``verify-pt2`` / ``verify-onnx``: ``hrm-deploy verify`` of the engine and of the ONNX on the same
  puzzles (``--samples``), wall time; with ``--baseline-src`` also the engine's under an older
  source tree (the "before" row); ``--rows cold``: each with empty caches (a new machine).

    python benchmarks/gpu_engine_load.py engines/x.step.cpu.torch.pt2 --onnx export/x.step.onnx \\
        --samples 32 --out benchmarks/results/gpu_engine_load_cpu.json

Run it on an idle machine for numbers to quote; the JSON records the CPU (model, flags digest,
AVX-512/AMX), the core count and the load average at the start.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

LOAD_CODE = """
import sys, time
start = time.perf_counter()
import torch
imported = time.perf_counter()
if sys.argv[2] == "torch-wrapper":
    model = torch._inductor.aoti_load_package(sys.argv[1])
else:
    from pathlib import Path
    from hrm_deploy.backends.torch.package import load_aoti_package
    model, _ = load_aoti_package(torch, Path(sys.argv[1]), single_threaded=False, device_index=-1)
print(imported - start, time.perf_counter() - imported)
"""

READY_CODE = """
import sys, time
from hrm_deploy.backends import open_runner
runner = open_runner(sys.argv[1])
runner.activate()
print(time.time() - float(sys.argv[2]))
"""


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.update(extra)
    return env


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return done.stdout


def load_row(engine: Path, loader: str, cold: bool, repeats: int, warm_cache: str) -> dict[str, Any]:
    """Import and load seconds of ``loader`` in fresh processes (an empty Inductor cache each, or ``warm_cache``)."""
    imports, loads = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="inductor-") as empty:
            env = _env(TORCHINDUCTOR_CACHE_DIR=empty if cold else warm_cache)
            out = _run([sys.executable, "-c", LOAD_CODE, str(engine), loader], env, 600)
        a, b = (float(x) for x in out.split()[-2:])
        imports.append(a)
        loads.append(b)
    return {
        "row": f"{loader} ({'empty' if cold else 'warm'} Inductor cache)",
        "import_torch_s": round(statistics.median(imports), 2),
        "load_s": round(statistics.median(loads), 3),
        "runs": [round(x, 3) for x in loads],
    }


def ready_row(engine: Path, probe_cached: bool, repeats: int) -> dict[str, Any]:
    """Seconds from a process's start to an active runner of ``engine``."""
    times = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="hrm-cache-") as empty:
            env = _env() if probe_cached else _env(HRM_DEPLOY_CACHE=empty)
            out = _run([sys.executable, "-c", READY_CODE, str(engine), repr(time.time())], env, 900)
        times.append(float(out.split()[-1]))
    what = "probe verdict cached" if probe_cached else "probe child first"
    return {"row": f"runner-ready ({what})", "seconds": round(statistics.median(times), 2), "runs": times}


def verify_row(
    artifact: Path, args: argparse.Namespace, repeats: int, src: Path | None = None, cold: bool = False
) -> dict[str, Any]:
    """Wall seconds of ``hrm-deploy verify ARTIFACT --samples N`` (a fresh process each); ``cold``:
    an empty Inductor cache and an empty hrm-deploy cache each time (a new machine or container:
    the probe runs, ``--data`` and ``--against`` are given so no data is regenerated)."""
    cmd = [sys.executable, "-m", "hrm_deploy", "verify", str(artifact), "--samples", str(args.samples)]
    cmd += ["--data", str(args.data)] if args.data else []
    cmd += ["--against", str(args.against)] if args.against else []
    times = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="cold-") as empty:
            extra = {"TORCHINDUCTOR_CACHE_DIR": f"{empty}/inductor", "HRM_DEPLOY_CACHE": f"{empty}/hrm"} if cold else {}
            env = _env(**extra) if src is None else dict(os.environ, PYTHONPATH=str(src), **extra)
            start = time.perf_counter()
            _run(cmd, env, 1200)
            times.append(time.perf_counter() - start)
    name = f"verify {artifact.suffix[1:]}" + (" (empty caches)" if cold else "") + (f" (source {src})" if src else "")
    return {"row": name, "samples": args.samples, "seconds": round(statistics.median(times), 2), "runs": times}


def machine() -> dict[str, Any]:
    import torch

    from hrm_deploy.backends.torch.host import cpu_identity

    return {
        "cpu": cpu_identity(),
        "cores": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", type=Path, help="a .pt2 engine (build-engine --backend torch)")
    parser.add_argument("--onnx", type=Path, help="the same model's ONNX, for the verify comparison")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--baseline-src", type=Path, help="an older source tree: its verify of the engine too")
    parser.add_argument("--data", type=Path, help="verify's --data (needed for --cold)")
    parser.add_argument("--against", type=Path, help="verify's --against (needed for --cold)")
    parser.add_argument("--rows", default="load,ready,verify", help="load, ready, verify, cold (comma list)")
    parser.add_argument("--skip-torch-wrapper", action="store_true", help="leave out torch's Python loader rows")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_engine_load_cpu.json")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"engine": args.engine.name, "machine": machine(), "rows": []}

    def add(row: dict[str, Any]) -> None:
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    rows = set(args.rows.split(","))
    warm = tempfile.mkdtemp(prefix="inductor-warm-")
    if "load" in rows and not args.skip_torch_wrapper:
        add(load_row(args.engine, "torch-wrapper", True, args.repeats, warm))
        _run(
            [sys.executable, "-c", LOAD_CODE, str(args.engine), "torch-wrapper"],
            _env(TORCHINDUCTOR_CACHE_DIR=warm),
            600,
        )
        add(load_row(args.engine, "torch-wrapper", False, args.repeats, warm))
    if "load" in rows:
        add(load_row(args.engine, "hrm-deploy-loader", True, args.repeats, warm))
    if "ready" in rows:
        add(ready_row(args.engine, False, args.repeats))
        _run([sys.executable, "-c", READY_CODE, str(args.engine), repr(time.time())], _env(), 900)  # caches the verdict
        add(ready_row(args.engine, True, args.repeats))
    if args.onnx and rows & {"verify", "cold"}:
        verify_row(args.onnx, args, 1)  # the puzzles regenerated into the cache, not timed
        cold = "cold" in rows
        onnx = verify_row(args.onnx, args, args.repeats, cold=cold)
        add(onnx)
        pt2 = verify_row(args.engine, args, args.repeats, cold=cold)
        add(pt2)
        if args.baseline_src:
            add(verify_row(args.engine, args, args.repeats, args.baseline_src, cold=cold))
        result["verify_ratio_pt2_over_onnx"] = round(pt2["seconds"] / onnx["seconds"], 2)
        add({"row": "ratio", "verify_pt2_over_onnx": result["verify_ratio_pt2_over_onnx"]})


if __name__ == "__main__":
    main()
