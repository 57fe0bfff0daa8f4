"""The trainer's hyper-parameters: one frozen config, upstream's names where upstream has them,
each checked when it is made."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hrm_deploy.errors import ConfigError

OPTIMIZERS = ("adam_atan2", "adamw")


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters (upstream names where upstream has them)."""

    data_path: str
    out_dir: str = "runs/hrm"
    steps: int = 1000  # optimizer steps = ACT segments on one global batch
    global_batch_size: int = 64
    lr: float = 1e-4
    lr_min_ratio: float = 1.0
    lr_warmup_steps: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    puzzle_emb_lr: float = 1e-2
    puzzle_emb_weight_decay: float = 0.1
    loss_type: str = "stablemax_cross_entropy"
    optimizer: str = "adam_atan2"  # or "adamw"
    seed: int = 0
    checkpoint_every: int = 0  # also write step_N.pt every N steps (0: never)
    checkpoint_minutes: float = 5.0  # refresh last.pt at least this often (0: only at the end / on a signal)
    overwrite: bool = False  # start over in an out_dir that already holds a run
    eval_every: int = 0  # 0: only at the end
    eval_samples: int = 200  # fast evaluation subset of the test split
    threads: int = 0  # torch CPU threads (0: torch's default)
    device: str = "auto"  # auto (cuda when available), cpu, cuda, cuda:N
    compile: bool = False  # torch.compile the model core (GPU; minutes of warm-up)
    tf32: bool = True  # TF32 matmuls on CUDA (Ampere and newer)
    export_upstream: bool = False  # also write upstream's step_N + all_config.yaml under <out_dir>/upstream
    ema: bool = False  # evaluate and checkpoint an exponential moving average of the weights (upstream TRM's ema)
    ema_rate: float = 0.999
    log_to: tuple[str, ...] = ()  # extra metric sinks: "tensorboard", "wandb" (rank 0)
    version: int = 1

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"optimizer {self.optimizer!r} unknown; use adam_atan2 or adamw")
        if self.loss_type not in ("stablemax_cross_entropy", "softmax_cross_entropy"):
            raise ConfigError(f"loss_type {self.loss_type!r} unknown")
        if self.steps < 1 or self.global_batch_size < 1:
            raise ConfigError("steps and global_batch_size must be >= 1")
        finite = {
            "lr": self.lr,
            "puzzle_emb_lr": self.puzzle_emb_lr,
            "weight_decay": self.weight_decay,
            "puzzle_emb_weight_decay": self.puzzle_emb_weight_decay,
            "checkpoint_minutes": self.checkpoint_minutes,
        }
        for name, value in finite.items():
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.lr == 0:
            raise ConfigError("lr must be > 0 (a zero learning rate trains nothing)")
        if not 0.0 <= self.lr_min_ratio <= 1.0 or not 0.0 <= self.beta1 < 1.0 or not 0.0 <= self.beta2 < 1.0:
            raise ConfigError("lr_min_ratio must be in [0, 1] and beta1, beta2 in [0, 1)")
        if not 0 <= self.threads <= 4096:
            raise ConfigError(f"threads must be between 0 (torch's default) and 4096, got {self.threads}")
        for name in ("lr_warmup_steps", "checkpoint_every", "eval_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 < self.ema_rate < 1.0:
            raise ConfigError(f"ema_rate must be in (0, 1), got {self.ema_rate}")
        if self.eval_samples < 1:
            raise ConfigError(f"eval_samples must be >= 1, got {self.eval_samples}")
