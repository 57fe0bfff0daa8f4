"""bf16 and TF32 against exact float32 on a trained checkpoint, in one process, no compiles: the
PyTorch reference (eager) run in exact float32, in float32 with TF32 matmuls allowed, and in
bfloat16, on the same held-out puzzles; per variant the argmax agreement with exact fp32, the
logits' max abs error and exact accuracy (whole puzzle right).

    python benchmarks/gpu_precision.py [--checkpoint CKPT] [--samples 256] [--device cuda] [--out FILE]

The default checkpoint is the bundled sudoku-small model, its puzzles drawn from its preset's
generator with a seed its training data did not use. TF32 only changes CUDA matmuls, so on the
CPU (``--device cpu``, for tests) its row equals exact fp32.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SEED = 7  # not the presets' training seed


def puzzles(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, labels) int32 [n, 81]: held-out Sudoku of the bundled preset's difficulty."""
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.train.presets import preset

    blanks = tuple(preset("sudoku-small")["data"]["blanks"])
    split = generate_sudoku(SudokuSpec(train=0, test=n, blanks=blanks, augment=0, seed=SEED))["test"]
    return np.asarray(split.inputs, np.int32), np.asarray(split.labels, np.int32)


def run_variant(checkpoint: Path, inputs: np.ndarray, device: str, dtype: str, tf32: bool, batch: int) -> np.ndarray:
    """Logits float32 [n, 81, V] of the reference in ``dtype`` with TF32 matmuls ``tf32``."""
    import torch

    from hrm_deploy.backends.reference import TorchRunner

    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        with TorchRunner(checkpoint, device=device, dtype=dtype) as runner:
            parts = []
            for start in range(0, len(inputs), batch):
                x = inputs[start : start + batch]
                out = runner.infer({"inputs": x, "puzzle_identifiers": np.zeros(len(x), np.int32)})
                parts.append(np.asarray(out["logits"], np.float32))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return np.concatenate(parts)


def compare(logits: np.ndarray, exact: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """Agreement with exact fp32's argmax, logits error, and exact accuracy against ``labels``."""
    answer = logits.argmax(-1)
    return {
        "argmax_agreement": float((answer == exact.argmax(-1)).mean()),
        "logits_max_abs": float(np.abs(logits - exact).max()),
        "logits_mean_abs": float(np.abs(logits - exact).mean()),
        "exact_accuracy": float((answer == labels).all(-1).mean()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: the bundled sudoku-small model")
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_precision.json")
    args = parser.parse_args(argv)
    import torch

    from hrm_deploy.train.presets import bundled_checkpoint

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_precision: no CUDA GPU visible to torch here (nothing measured)", file=sys.stderr)
        return 2
    checkpoint = Path(args.checkpoint or bundled_checkpoint())
    inputs, labels = puzzles(args.samples)
    report: dict[str, Any] = {
        "benchmark": "bf16 and TF32 vs exact fp32, PyTorch reference in process (eager, no compiles)",
        "checkpoint": checkpoint.name,
        "samples": len(inputs),
        "device": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor() or "cpu",
        "torch": torch.__version__,
        "rows": {},
    }
    exact = None
    for name, dtype, tf32 in (("fp32", "float32", False), ("fp32-tf32", "float32", True), ("bf16", "bfloat16", False)):
        start = time.perf_counter()
        logits = run_variant(checkpoint, inputs, args.device, dtype, tf32, args.batch)
        exact = logits if exact is None else exact
        report["rows"][name] = {**compare(logits, exact, labels), "seconds": round(time.perf_counter() - start, 2)}
        print(f"{name:10s} {json.dumps(report['rows'][name])}", flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
