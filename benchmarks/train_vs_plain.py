"""CPU trainer throughput of the sudoku-tiny preset vs a plain PyTorch loop over the same
model code (forward with the ACT carry, upstream's loss, backward, torch AdamW; no data
pipeline, schedules, sign-SGD, metrics or checkpoints), same machine, same run.

    python benchmarks/train_vs_plain.py [--steps 300]
Writes benchmarks/results/train_vs_plain_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hrm_deploy.data.format import load_split
from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.hrm import build_model
from hrm_deploy.train.loop import TrainConfig, to_batch, train
from hrm_deploy.train.losses import act_loss
from hrm_deploy.train.presets import preset


def plain_loop(model_config: HRMConfig, data: str, steps: int, batch: int, lr: float) -> float:
    split = load_split(data, "train")
    model = build_model(model_config, seed=0).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = np.random.default_rng(0)
    carry = None
    start = time.perf_counter()
    for _ in range(steps):
        b = to_batch(split, rng.integers(0, len(split), size=batch), split.metadata.ignore_label_id)
        carry = carry or model.initial_carry(b)
        carry, outputs = model(carry, b)
        loss, _ = act_loss(outputs, carry.current_data["labels"], carry.halted, carry.steps, "stablemax_cross_entropy")
        optimizer.zero_grad(set_to_none=True)
        (loss / batch).backward()
        optimizer.step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default="benchmarks/results/train_vs_plain_cpu.json")
    args = parser.parse_args()
    chosen = preset("sudoku-tiny")
    model_config = HRMConfig(seq_len=81, vocab_size=11, **chosen["model"])
    batch = chosen["train"]["global_batch_size"]
    with tempfile.TemporaryDirectory() as tmp:
        data = str(Path(tmp) / "data")
        generate_sudoku(SudokuSpec(train=2000, test=16, blanks=(3, 6), seed=0), data)
        cfg = TrainConfig(
            data_path=data,
            out_dir=str(Path(tmp) / "run"),
            device="cpu",
            **{**chosen["train"], "steps": args.steps, "eval_every": 0, "eval_samples": 16},
        )
        start = time.perf_counter()
        result = train(model_config, cfg, progress=False)
        ours = time.perf_counter() - start
        timing = result.metrics["timing"]
        plain = plain_loop(model_config, data, args.steps, batch, chosen["train"]["lr"])
    out = {
        "preset": "sudoku-tiny",
        "steps": args.steps,
        "global_batch": batch,
        "threads": torch.get_num_threads(),
        "trainer_samples_per_s_loop": round(batch * args.steps / (timing["data_s"] + timing["compute_s"]), 1),
        "trainer_seconds_incl_setup_and_final_eval": round(ours, 2),
        "plain_loop_samples_per_s": round(batch * args.steps / plain, 1),
        "torch": torch.__version__,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
