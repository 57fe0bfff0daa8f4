"""Named presets: (model config overrides, train config overrides)."""

from __future__ import annotations

from typing import Any

from hrm_deploy.errors import ConfigError

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # CPU-sized: trains in minutes on 2 cores on generated easy Sudoku (see README for the difficulty).
    "sudoku-tiny": {
        "model": dict(hidden_size=64, num_heads=4, H_layers=2, L_layers=2, H_cycles=1, L_cycles=2,
                      halt_max_steps=4, expansion=4.0, puzzle_emb_ndim=64, forward_dtype="float32"),
        "train": dict(steps=600, global_batch_size=64, lr=3e-3, lr_min_ratio=0.1, lr_warmup_steps=50,
                      weight_decay=0.1, puzzle_emb_lr=1e-2, puzzle_emb_weight_decay=0.1, eval_every=200,
                      eval_samples=200),
    },
    # Upstream's Sudoku-Extreme-1k settings (README): for GPUs.
    "sudoku": {
        "model": dict(hidden_size=512, num_heads=8, H_layers=4, L_layers=4, H_cycles=2, L_cycles=2,
                      halt_max_steps=16, expansion=4.0, puzzle_emb_ndim=512, forward_dtype="bfloat16"),
        "train": dict(steps=26041, global_batch_size=768, lr=1e-4, lr_min_ratio=1.0, lr_warmup_steps=2000,
                      weight_decay=1.0, puzzle_emb_lr=1e-4, puzzle_emb_weight_decay=1.0, eval_every=2000),
    },
    # Upstream's Maze 30x30 settings: for GPUs.
    "maze": {
        "model": dict(hidden_size=512, num_heads=8, H_layers=4, L_layers=4, H_cycles=2, L_cycles=2,
                      halt_max_steps=16, expansion=4.0, puzzle_emb_ndim=512, forward_dtype="bfloat16"),
        "train": dict(steps=26041, global_batch_size=768, lr=1e-4, lr_min_ratio=1.0, lr_warmup_steps=2000,
                      weight_decay=1.0, puzzle_emb_lr=1e-4, puzzle_emb_weight_decay=1.0, eval_every=2000),
    },
}


def preset(name: str) -> dict[str, dict[str, Any]]:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]
