"""The weight-stripped engine stage (run scripts/device_strip_refit.sh, after scripts/device_check.sh):
on a machine with a CUDA GPU and standard TensorRT (a Jetson board, or a GPU machine with the
``tensorrt`` package), build the full and the weight-stripped FP16 engine of the Sudoku-size step graph
(hidden 512, 16 ACT steps, random weights) and check that

1. the stripped plan is at most 10 % of the full one (its weights are 52 MiB of FP16);
2. its first run refits it from the graph (sha256-checked) and saves the whole engine beside it;
3. its answers are bit-equal to the full engine's on 64 puzzles, and a second run loads the saved refit.

    python scripts/device_strip_refit.py [OUT] [--graph STEP.onnx] [--budget SECONDS]

``--graph``: a step graph exported elsewhere; otherwise it is exported here from a random Sudoku-size
checkpoint (benchmarks/gpu_latency.py --save-checkpoint). Where TensorRT is not
installed (TensorRT-RTX cannot build stripped engines without a GPU, and has no Orin target) it says so
and exits 0. device_strip_refit.json / .md under OUT (default benchmarks/results/device_check/).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_check_lib import HRM, PY, Check, finish, new_summary  # noqa: E402 - the scripts folder is not a package

BUDGET_S = 600.0
MAX_STRIPPED_FRACTION = 0.10


def compare(full: Path, stripped: Path, out: Path) -> int:
    """Run both engines on the same 64 random puzzles; write the comparison to ``out``; exit 1 on a difference."""
    import numpy as np

    from hrm_deploy.backends import open_runner
    from hrm_deploy.backends.tensorrt.refit import refitted_path

    rng = np.random.default_rng(0)
    feeds: dict[str, np.ndarray] = {}
    outputs: list[dict[str, np.ndarray]] = []
    for path in (full, stripped, stripped):  # the stripped engine twice: refit, then the saved refit
        with open_runner(path) as runner:
            if not feeds:
                seq_len = int(runner.seq_len or 81)
                feeds = {"inputs": rng.integers(1, 11, (64, seq_len)), "puzzle_identifiers": np.zeros(64, np.int64)}
            outputs.append(runner.infer(feeds))
    equal = all(np.array_equal(outputs[0][name], later[name]) for later in outputs[1:] for name in outputs[0])
    result = {
        "full_bytes": full.stat().st_size,
        "stripped_bytes": stripped.stat().st_size,
        "stripped_fraction": round(stripped.stat().st_size / full.stat().st_size, 4),
        "refitted_saved": refitted_path(stripped).is_file(),
        "outputs_bit_equal": bool(equal),
    }
    out.write_text(json.dumps(result, indent=2))
    ok = equal and result["refitted_saved"] and result["stripped_fraction"] <= MAX_STRIPPED_FRACTION
    print(json.dumps(result))
    return 0 if ok else 1


def run(check: Check, work: Path, graph: Path | None) -> None:
    if graph is None:
        ckpt, graph = work / "sudoku-size-random.pt", work / "sudoku-size.step.onnx"
        check.stage(
            "Sudoku-size checkpoint (random weights)",
            [PY, "benchmarks/gpu_latency.py", "--save-checkpoint", str(ckpt)],
            120,
            "strip_ckpt.log",
        )
        check.stage(
            "export the step graph",
            [*HRM, "export", str(ckpt), "--mode", "step", "-o", str(graph)],
            180,
            "strip_export.log",
        )
    common = [
        "--fp16",
        "--backend",
        "tensorrt",
        "--target",
        "datacenter",
        "--max-batch",
        "64",
        "--timing-cache",
        "none",
    ]
    full, stripped = work / "full.engine", work / "stripped.engine"
    check.stage(
        "build the full FP16 engine",
        [*HRM, "build-engine", str(graph), *common, "-o", str(full)],
        300,
        "strip_full.log",
    )
    check.stage(
        "build the weight-stripped FP16 engine",
        [*HRM, "build-engine", str(graph), *common, "--strip-weights", "-o", str(stripped)],
        300,
        "strip_stripped.log",
    )
    result = check.out / "device_strip_refit_compare.json"
    argv = [PY, __file__, "--compare", str(full), str(stripped), str(result)]
    check.stage(
        "refit on first run, outputs bit-equal to the full engine, saved refit reused", argv, 120, "strip_compare.log"
    )
    if result.is_file():
        check.summary["strip_refit"] = json.loads(result.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="weight-stripped engine stage (run scripts/device_strip_refit.sh)")
    parser.add_argument("out", nargs="?", default="benchmarks/results/device_check")
    parser.add_argument("--graph", type=Path, help="a step graph exported elsewhere")
    parser.add_argument("--budget", type=float, default=BUDGET_S)
    parser.add_argument("--compare", nargs=3, type=Path, metavar=("FULL", "STRIPPED", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if importlib.util.find_spec("tensorrt") is None:
        print("no standard TensorRT here (pip install tensorrt, or JetPack's on a board): nothing to check")
        return 0
    import tensorrt

    if not hasattr(tensorrt, "Builder"):
        print("tensorrt here is type stubs only: nothing to check")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    what = "weight-stripped FP16 step engine: size vs the full engine, refit on first run, bit-equal outputs"
    import torch

    summary = new_summary(torch, what, args.budget)
    summary["tensorrt"] = tensorrt.__version__
    check = Check(out, args.budget, summary, stem="device_strip_refit")
    check.write()
    with tempfile.TemporaryDirectory() as tmp:
        run(check, Path(tmp), args.graph)
    return finish(check, "stripped-engine check")


if __name__ == "__main__":
    sys.exit(main())
