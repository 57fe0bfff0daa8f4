"""Named presets: (model config overrides, train config overrides)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrm_deploy.errors import ConfigError

if TYPE_CHECKING:
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.train.config import TrainConfig

# What the two CPU presets share: a hidden-64 model of one H and one L layer with float32 compute,
# and the optimizer settings found by benchmarks/tiny_recipe.py.
_CPU_MODEL: dict[str, Any] = dict(
    hidden_size=64,
    num_heads=4,
    H_layers=1,
    L_layers=1,
    expansion=4.0,
    puzzle_emb_ndim=64,
    rope_theta=20.0,
    forward_dtype="float32",
)
_CPU_TRAIN: dict[str, Any] = dict(
    lr=2e-3, lr_min_ratio=0.1, weight_decay=0.1, puzzle_emb_lr=1e-2, puzzle_emb_weight_decay=0.1, eval_samples=200
)

# Upstream's GPU settings (README), the same for Sudoku-Extreme-1k and Maze 30x30.
_UPSTREAM: dict[str, dict[str, Any]] = {
    "model": dict(
        hidden_size=512,
        num_heads=8,
        H_layers=4,
        L_layers=4,
        H_cycles=2,
        L_cycles=2,
        halt_max_steps=16,
        expansion=4.0,
        puzzle_emb_ndim=512,
        forward_dtype="bfloat16",
    ),
    "train": dict(
        steps=26041,
        global_batch_size=768,
        lr=1e-4,
        lr_min_ratio=1.0,
        lr_warmup_steps=2000,
        weight_decay=1.0,
        puzzle_emb_lr=1e-4,
        puzzle_emb_weight_decay=1.0,
        eval_every=2000,
    ),
}

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    # CPU-sized: >= 90% exact on held-out generated Sudoku with 3-6 blanks in <= 3 minutes on
    # 2 cores (benchmarks/tiny_recipe.py found it). One ACT segment of one H and one L pass:
    # on 2 cores more optimizer steps beat depth. A small rope_theta gives RoPE frequencies
    # whose periods fit the 81-cell board (rows, columns, boxes); 10000 learns several times slower.
    "sudoku-tiny": {
        "model": dict(_CPU_MODEL, H_cycles=1, L_cycles=1, halt_max_steps=1),
        "train": dict(_CPU_TRAIN, steps=3500, global_batch_size=16, lr_warmup_steps=50, eval_every=1000),
        "data": dict(train=5000, test=300, blanks=(3, 6), augment=0, seed=0),
    },
    # The embedded default: real ACT on CPU. 8 ACT segments of 2 H x 2 L cycles (1 + 1 layers,
    # hidden 64), trained once by scripts/refresh_bundled_checkpoint.py --preset sudoku-small on
    # 2 shared cores (35 min, 15000 steps). 10-30 blanks need 1-4 rounds of row/column/box elimination,
    # more than one segment resolves, so exact accuracy rises over the steps (two 2000-step probes:
    # 12-30 blanks gave 2 % after step 1 and 45 % after step 8). ``heldout``: the evaluation
    # set's overrides of ``data`` (same spec, a seed training never used).
    "sudoku-small": {
        "model": dict(_CPU_MODEL, H_cycles=2, L_cycles=2, halt_max_steps=8),
        "train": dict(
            _CPU_TRAIN, steps=15000, global_batch_size=32, lr_warmup_steps=100, eval_every=5000, checkpoint_every=2500
        ),
        "data": dict(train=40000, test=300, blanks=(10, 30), augment=0, seed=0),
        "heldout": dict(train=10, test=500, seed=1),
    },
    # A Tiny Recursive Model in upstream's Sudoku variant (mlp_t, no positions, EMA), CPU-sized:
    # hidden 64, one 2-layer network run T=2 x (n=2 + 1) times per ACT step, 3 ACT steps, a
    # 16-position puzzle prefix (upstream's default). Trained once by
    # scripts/refresh_bundled_checkpoint.py --preset trm-sudoku-small on 2 shared CPU cores.
    "trm-sudoku-small": {
        "family": {"name": "trm"},
        "model": dict(
            hidden_size=64,
            num_heads=4,
            L_layers=2,
            H_cycles=2,
            L_cycles=2,
            halt_max_steps=3,
            expansion=4.0,
            puzzle_emb_ndim=64,
            puzzle_emb_len=16,
            mlp_t=True,
            pos_encodings="none",
            no_ACT_continue=True,
            forward_dtype="float32",
        ),
        "train": dict(
            _CPU_TRAIN,
            steps=1200,
            global_batch_size=16,
            lr_warmup_steps=50,
            eval_every=400,
            ema=True,
            ema_rate=0.99,
        ),
        "data": dict(train=5000, test=300, blanks=(3, 10), augment=0, seed=0),
        "heldout": dict(train=10, test=500, seed=1),
    },
    # ARC on CPU for the walk-through and tests: seconds per step. One ACT segment pair of one H
    # and one L pass, on a small-canvas dataset (`hrm-deploy data arc --max-grid 10`); it runs the
    # ARC pipeline end to end, it does not solve ARC. The data is the user's task folder.
    "arc-tiny": {
        "model": dict(_CPU_MODEL, H_cycles=1, L_cycles=1, halt_max_steps=2),
        "train": dict(_CPU_TRAIN, steps=200, global_batch_size=16, lr_warmup_steps=20, eval_every=200, eval_samples=64),
    },
    # Upstream's Sudoku-Extreme-1k settings (README): for GPUs.
    "sudoku": _UPSTREAM,
    # Upstream's Maze 30x30 settings: for GPUs.
    "maze": _UPSTREAM,
}


def preset(name: str) -> dict[str, dict[str, Any]]:
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]


def preset_model_config(name: str, seq_len: int, vocab_size: int, num_puzzle_identifiers: int) -> HRMConfig:
    """The model config of preset ``name`` (its family's config class) for a dataset's sizes."""
    from hrm_deploy.model.families import family_named

    chosen = preset(name)
    family = family_named(chosen.get("family", {}).get("name", "hrm"))
    return family.config_class(
        seq_len=seq_len, vocab_size=vocab_size, num_puzzle_identifiers=num_puzzle_identifiers, **chosen["model"]
    )


def train_configs(
    name: str, data: str | Path, out: str | Path, *, overrides: dict[str, Any] | None = None, **settings: Any
) -> tuple[HRMConfig, TrainConfig]:
    """The model and train configs for preset ``name`` on the dataset at ``data``.

    The model's sequence length, vocabulary and puzzle count come from the dataset's metadata;
    ``overrides`` (``None`` values mean "the preset's") replace the preset's train settings;
    ``settings`` are the remaining ``TrainConfig`` fields (device, compile, threads, ...)."""
    from hrm_deploy.data.format import load_split
    from hrm_deploy.train.config import TrainConfig

    chosen = preset(name)
    meta = load_split(data, "train").metadata
    model_config = preset_model_config(name, meta.seq_len, meta.vocab_size, meta.num_puzzle_identifiers)
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    config = TrainConfig(data_path=str(data), out_dir=str(out), **settings, **{**chosen["train"], **given})
    return model_config, config


DEFAULT_PRESET = "sudoku-small"


def bundled_checkpoint(preset: str = DEFAULT_PRESET) -> str:
    """Path of a trained checkpoint shipped with the package: ``sudoku-small`` (the embedded
    default: 8 ACT steps, the model every command uses when none is given) or ``sudoku-tiny``
    (one ACT step, the fast CPU test fixture)."""
    from importlib import resources

    path = resources.files("hrm_deploy") / "train" / "presets" / f"{preset}.pt"
    if not path.is_file():
        raise ConfigError(
            f"no bundled checkpoint for preset {preset!r}; bundled: sudoku-small, sudoku-tiny, trm-sudoku-small"
        )
    return str(path)
