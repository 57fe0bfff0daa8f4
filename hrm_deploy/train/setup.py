"""What a run of the trainer starts from: the data (checked against the model), the model (fresh,
given by the caller, or restored with its optimizers, RNG state, step and ACT carry from a trainer
checkpoint), the optimizers, the device, and the caller's hooks (:class:`Start`: a starting model,
frozen weights, an early end). :mod:`hrm_deploy.train.loop` runs the steps from there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from hrm_deploy.data.format import Split, check_fits_model, load_split
from hrm_deploy.errors import CheckpointError, ConfigError, DataError
from hrm_deploy.model.checkpoint import model_from_contents, read_checkpoint
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.hrm import HRMACT, ACTCarry, build_model
from hrm_deploy.train.config import TrainConfig
from hrm_deploy.train.distributed import Distributed, resolve_device
from hrm_deploy.train.ema import EMA
from hrm_deploy.train.optim import AdamATan2, PuzzleEmbeddingSignSGD
from hrm_deploy.train.state import carry_from, seed_all, set_rng_state


@dataclass(frozen=True)
class Start:
    """Hooks of :func:`hrm_deploy.train.loop.train`: ``model`` replaces the fresh model of a new run
    (ignored on resume: the checkpoint has the weights); ``frozen_weights`` keeps every parameter as
    it is, so only the puzzle-embedding rows the batches look up learn (their sign-SGD);
    ``should_stop(step)`` ends the run early (a time budget) with a final checkpoint, as
    ``stop_after`` does."""

    model: HRMACT | None = None
    frozen_weights: bool = False
    should_stop: Callable[[int], bool] | None = None

    def over(self, position: int) -> bool:
        """True when ``should_stop`` says the run ends before step ``position + 1``."""
        return self.should_stop is not None and self.should_stop(position)


def check_splits(train_split: Split, test_split: Split, vocab_size: int, where: str) -> None:
    """Labels must be token ids of the vocabulary (or the ignore label); the test split must not be empty."""
    for name, split in (("train", train_split), ("test", test_split)):
        if len(split) == 0:
            raise DataError(
                f"{where}: the {name} split holds no examples; regenerate the dataset with a non-empty "
                f"{name} split (accuracy on 0 examples means nothing)"
            )
        ignore = split.metadata.ignore_label_id
        for start in range(0, len(split), 65536):  # chunks: the arrays are memory-mapped and may be large
            labels = np.asarray(split.labels[start : start + 65536])
            valid = (labels >= 0) & (labels < vocab_size)
            if ignore is not None:
                valid |= labels == ignore
            if valid.all():
                continue
            bad = int(labels[~valid].flat[0])
            raise DataError(
                f"{where}: the {name} split has label {bad}, outside the vocabulary [0, {vocab_size}) "
                "and not the ignore label; the dataset is damaged or built for another vocabulary"
            )


def build_optimizers(model: HRMACT, config: TrainConfig, fused: bool):
    params = list(model.parameters())
    betas = (config.beta1, config.beta2)
    if config.optimizer == "adamw":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(
            params, lr=0.0, betas=betas, weight_decay=config.weight_decay, **({"fused": True} if fused else {})
        )
    else:
        optimizer = AdamATan2(params, lr=0.0, betas=betas, weight_decay=config.weight_decay)
    emb_opt = None
    if model.inner.config.puzzle_emb_ndim > 0:
        emb_opt = PuzzleEmbeddingSignSGD(model.inner.puzzle_emb, 0.0, config.puzzle_emb_weight_decay)
    return optimizer, emb_opt


def load_splits(model_config: HRMConfig, config: TrainConfig) -> tuple[Split, Split]:
    train_split = load_split(config.data_path, "train")
    test_split = load_split(config.data_path, "test")
    check_fits_model(train_split.metadata, model_config, config.data_path)
    check_splits(train_split, test_split, model_config.vocab_size, config.data_path)
    return train_split, test_split


@dataclass
class Setup:
    """What a (resumed) run starts from."""

    model: HRMACT
    step_model: torch.nn.Module  # the DDP wrapper under torchrun, else the model
    optimizer: torch.optim.Optimizer
    emb_opt: PuzzleEmbeddingSignSGD | None
    device: torch.device
    position: int
    carry: ACTCarry | None
    ema: EMA | None = None

    def eval_model(self) -> HRMACT:
        """The weights evaluation and checkpoints use: the EMA copy when on, else the model."""
        return self.ema.copy_of(self.model) if self.ema is not None else self.model


def set_up(
    model_config: HRMConfig, config: TrainConfig, resume: str | None, dist_info: Distributed, start: Start
) -> Setup:
    """Build (or restore) model, optimizers, RNG state, step position and ACT carry."""
    position, carry_saved, contents = 0, None, None
    shadow: dict[str, torch.Tensor] | None = None  # EMA weights of a resumed run
    if resume:
        from hrm_deploy.train.checkpointer import written_by_us

        not_ours = CheckpointError(
            f"{resume} is not a trainer checkpoint (it has weights but no optimizer and random state, e.g. an "
            "upstream step_N or a bundled preset); --resume takes a last.pt/step_N.pt written by hrm-deploy train"
        )
        try:
            contents = read_checkpoint(resume)
        except (CheckpointError, ConfigError):  # an upstream file's hints name export's flags, not train's
            if written_by_us(resume):
                raise
            raise not_ours from None
        if contents.kind != "hrm-deploy" or not all(k in contents.extra for k in ("optimizer", "rng")):
            raise not_ours
        model = model_from_contents(contents)  # the weights saved for inference (the EMA copy with ema)
        if contents.extra.get("live_state") is not None:
            shadow = {"inner." + k: v for k, v in contents.state_dict.items()}
            model.inner.load_state_dict(contents.extra["live_state"])
        if contents.config != model_config:
            raise ConfigError(f"{resume} was trained with a different model config; resume it without overrides")
        position = int(contents.step or 0)
        if config.steps <= position:  # nothing would run: say so instead of finishing silently
            raise ConfigError(
                f"--steps {config.steps}: {resume} is already at step {position} (steps count from the run's "
                f"start); give --steps above {position} to train further"
            )
        carry_saved = contents.extra.get("carry")
    else:
        model = start.model if start.model is not None else build_model(model_config, seed=config.seed)
        seed_all(config.seed, dist_info.rank)
    model.requires_grad_(not start.frozen_weights)  # frozen: no optimizer ever sees a gradient
    device = resolve_device(config.device, dist_info.local_rank)
    if device.type == "cuda" and config.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model.to(device).train()
    ema = None
    if config.ema:
        ema = EMA(model, config.ema_rate, shadow)
    optimizer, emb_opt = build_optimizers(model, config, fused=device.type == "cuda")
    if contents is not None:
        optimizer.load_state_dict(contents.extra["optimizer"])
        if emb_opt is not None and contents.extra.get("puzzle_emb_optimizer"):
            emb_opt.load_state_dict(contents.extra["puzzle_emb_optimizer"])
        set_rng_state(contents.extra["rng"])
    carry = carry_from(carry_saved, device, dist_info)
    if config.compile:
        model.inner.compile()  # in place: state-dict keys stay upstream's
    step_model: torch.nn.Module = model
    if dist_info.world > 1 and not start.frozen_weights:  # frozen: no gradient to all-reduce
        from torch.nn.parallel import DistributedDataParallel

        step_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return Setup(model, step_model, optimizer, emb_opt, device, position, carry, ema)
