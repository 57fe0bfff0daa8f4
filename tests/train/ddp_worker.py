"""Run by tests under torchrun: train MICRO on a dataset with exploration off (so the
result does not depend on per-rank random draws)."""

import sys

from hrm_deploy.model.config import HRMConfig
from hrm_deploy.train.loop import TrainConfig, train

MICRO = HRMConfig(
    seq_len=81,
    vocab_size=11,
    hidden_size=32,
    num_heads=2,
    H_layers=1,
    L_layers=1,
    H_cycles=1,
    L_cycles=1,
    halt_max_steps=3,
    puzzle_emb_ndim=32,
    halt_exploration_prob=0.0,
)

if __name__ == "__main__":
    data, out = sys.argv[1], sys.argv[2]
    train(
        MICRO,
        TrainConfig(
            data_path=data,
            out_dir=out,
            steps=4,
            global_batch_size=8,
            lr=1e-3,
            lr_warmup_steps=1,
            eval_samples=8,
            device="cpu",
            threads=1,
        ),
        progress=False,
    )
