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
import time
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
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    chosen = preset(args.preset)
    batch = args.batch or chosen["train"]["global_batch_size"]
    model_config = HRMConfig(seq_len=81, vocab_size=11, **chosen["model"])
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        generate_sudoku(SudokuSpec(train=max(batch * 2, 200), test=16, blanks=(20, 40), seed=0), str(data))
        base = dict(chosen["train"], global_batch_size=batch, eval_every=0, eval_samples=16)
        cfg = TrainConfig(data_path=str(data), out_dir=str(Path(tmp) / "run"), device=args.device,
                          **{**base, "steps": args.warmup_steps + args.steps})
        warm = train(model_config, cfg, stop_after=args.warmup_steps, progress=False)
        start = time.perf_counter()
        result = train(model_config, cfg, resume=str(warm.checkpoint), stop_after=args.steps, progress=False)
        elapsed = time.perf_counter() - start
    device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor() or "cpu"
    out = {"preset": args.preset, "device": args.device, "device_name": device_name, "global_batch": batch,
           "forward_dtype": model_config.forward_dtype, "steps_timed": args.steps,
           "seconds_incl_resume_and_final_eval": round(elapsed, 2),
           "samples_per_s_last_step": round(result.metrics.get("samples_per_s", 0.0), 1),
           "timing": result.metrics.get("timing"), "torch": torch.__version__}
    compute = (result.metrics.get("timing") or {}).get("compute_s")
    if compute:
        out["samples_per_s_compute"] = round(batch * args.steps / compute, 1)
    path = Path(args.out or f"benchmarks/results/train_speed_{args.preset}_{args.device.split(':')[0]}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
