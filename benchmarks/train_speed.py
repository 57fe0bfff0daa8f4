"""Trainer throughput (samples/s = global batch x steps / time) on generated Sudoku.

    python benchmarks/train_speed.py --preset sudoku-tiny --steps 30             # CPU
    python benchmarks/train_speed.py --preset sudoku --steps 30 --device cuda     # GPU
Writes benchmarks/results/train_speed_<preset>_<device>.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

import torch

from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.train.loop import TrainConfig, train
from hrm_deploy.train.presets import preset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", default="sudoku-tiny")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model core")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    chosen = preset(args.preset)
    batch = args.batch or chosen["train"]["global_batch_size"]
    model_config = HRMConfig(seq_len=81, vocab_size=11, **chosen["model"])
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        generate_sudoku(SudokuSpec(train=max(batch * 2, 200), test=16, blanks=(20, 40), seed=0), str(data))
        base = dict(chosen["train"], global_batch_size=batch, eval_every=0, eval_samples=16)
        cfg = TrainConfig(
            data_path=str(data),
            out_dir=str(Path(tmp) / "run"),
            device=args.device,
            compile=args.compile,
            **{**base, "steps": args.warmup_steps + args.steps},
        )
        train(model_config, cfg, progress=False)
        rows = [json.loads(line) for line in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "step" in r]
    warm, last = steps[args.warmup_steps - 1], steps[-1]
    # Steady state: the timed steps after warm-up (torch.compile's compilation falls in warm-up).
    seconds = (last["data_s"] + last["compute_s"]) - (warm["data_s"] + warm["compute_s"])
    device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor() or "cpu"
    out = {
        "preset": args.preset,
        "device": args.device,
        "device_name": device_name,
        "global_batch": batch,
        "forward_dtype": model_config.forward_dtype,
        "compile": args.compile,
        "steps_timed": args.steps,
        "seconds_timed": round(seconds, 3),
        "data_wait_s": round(last["data_s"] - warm["data_s"], 3),
        "samples_per_s": round(batch * args.steps / seconds, 1),
        "torch": torch.__version__,
    }
    suffix = "_compile" if args.compile else ""
    path = Path(args.out or f"benchmarks/results/train_speed_{args.preset}_{args.device.split(':')[0]}{suffix}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
