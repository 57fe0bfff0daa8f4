"""The training loop (nanoGPT-shaped: one loop, one config, self-describing checkpoints).

One optimizer *step* is one ACT segment on one global batch. The ACT carry persists
across steps (upstream ``pretrain.py``): only rows that halted take new examples from
the incoming batch, so one example stays in the batch for up to ``halt_max_steps``
steps. Epochs are counted in examples drawn: one epoch visits every puzzle group once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hrm_deploy import progress as display
from hrm_deploy.data.format import Split, check_fits_model, load_split, select_examples
from hrm_deploy.errors import CheckpointError, ConfigError, DataError, HRMDeployError
from hrm_deploy.io import append_line
from hrm_deploy.metrics import row_scores, summary
from hrm_deploy.model.checkpoint import model_from_contents, read_checkpoint
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.hrm import HRMACT, ACTCarry, build_model
from hrm_deploy.train.checkpointer import Checkpointer, StopRequest, check_out_dir, rewind_metrics, run_lock
from hrm_deploy.train.distributed import (
    Distributed,
    agree,
    barrier,
    init_distributed,
    reduce_metrics,
    resolve_device,
    shutdown,
)
from hrm_deploy.train.ema import EMA
from hrm_deploy.train.losses import act_loss
from hrm_deploy.train.optim import AdamATan2, PuzzleEmbeddingSignSGD
from hrm_deploy.train.sampler import EpochSampler, to_batch
from hrm_deploy.train.sinks import MetricSinks
from hrm_deploy.train.start import Start
from hrm_deploy.train.state import carry_from, seed_all, set_rng_state

__all__ = ["EpochSampler", "TrainConfig", "TrainResult", "TrainingDiverged", "evaluate", "lr_at", "to_batch", "train"]


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


def lr_at(step: int, base: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup, then cosine down to ``min_ratio * base`` (upstream's schedule)."""
    if step < warmup:
        return base * step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return base * (min_ratio + max(0.0, (1 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))))


@torch.inference_mode()
def evaluate(model: HRMACT, split: Split, samples: int | None = None, batch: int = 256) -> dict[str, float]:
    """Exact and token accuracy (:func:`hrm_deploy.metrics.summary`) of the fixed-step unroll
    (upstream's eval) on a subset."""
    from hrm_deploy.export.unroll import unroll

    was_training = model.training
    model.eval()
    fixed = unroll(model)
    idx = select_examples(split, samples, seed=0) if samples else np.arange(len(split))
    device = next(model.parameters()).device
    solved, token_fraction = [], []
    for start in range(0, len(idx), batch):
        b = to_batch(split, idx[start : start + batch], split.metadata.ignore_label_id, device=device)
        logits = fixed(b["inputs"], b["puzzle_identifiers"])[0]
        rows = row_scores(logits.argmax(-1), b["labels"])  # scored on the device: [B] each
        solved.append(rows[0].cpu().numpy())
        token_fraction.append(rows[1].cpu().numpy())
    model.train(was_training)
    return summary(np.concatenate(solved), np.concatenate(token_fraction))


@dataclass
class TrainResult:
    checkpoint: Path
    metrics: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False  # stopped by SIGINT/SIGTERM; ``checkpoint`` resumes it


class TrainingDiverged(HRMDeployError):
    """The loss became NaN/inf; the last good checkpoint is kept."""


def _check_splits(train_split: Split, test_split: Split, vocab_size: int, where: str) -> None:
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


def _build_optimizers(model: HRMACT, config: TrainConfig, fused: bool):
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


def _set_lrs(position: int, config: TrainConfig, optimizer, emb_opt) -> float:
    lr = lr_at(position, config.lr, config.lr_warmup_steps, config.steps, config.lr_min_ratio)
    for g in optimizer.param_groups:
        g["lr"] = lr
    if emb_opt:
        emb_opt.param_groups[0]["lr"] = lr_at(
            position, config.puzzle_emb_lr, config.lr_warmup_steps, config.steps, config.lr_min_ratio
        )
    return lr


class _ProgressBar:
    """Steps done/total with ETA, loss, accuracy, samples/s and the data-wait vs compute split
    (rank 0 only): a bar on a terminal, a line every few seconds in a log (CI, nohup)."""

    def __init__(self, enabled: bool, total: int, completed: int):
        self._display = contextlib.ExitStack()
        self._tracker = self._display.enter_context(
            display.progress(total, "train", quiet=not enabled, unit="steps", done=completed)
        )
        self._step = completed

    def update(self, row: dict[str, Any]) -> None:
        info = (
            f"loss {row['loss']:.3f} acc {row['token_accuracy']:.3f} {row['samples_per_s']:.0f} samples/s "
            f"(data {row['data_s']:.0f}s, compute {row['compute_s']:.0f}s)"
        )
        if "eval" in row:
            info += f" eval exact {row['eval']['exact_accuracy']:.3f}"
        self._tracker.note(info)
        self._tracker(row["step"] - self._step)
        self._step = row["step"]

    def stop(self) -> None:
        self._display.close()


def _out_of_memory(config: TrainConfig, dist_info: Distributed, out: Path) -> ConfigError:
    smaller = max(dist_info.world, config.global_batch_size // 2)
    return ConfigError(
        f"out of GPU memory at global batch {config.global_batch_size}; retry with --batch-size "
        f"{smaller} (and --resume {out / 'last.pt'} if it exists), or a smaller model"
    )


def _load_splits(model_config: HRMConfig, config: TrainConfig) -> tuple[Split, Split]:
    train_split = load_split(config.data_path, "train")
    test_split = load_split(config.data_path, "test")
    check_fits_model(train_split.metadata, model_config, config.data_path)
    _check_splits(train_split, test_split, model_config.vocab_size, config.data_path)
    return train_split, test_split


@dataclass
class _Setup:
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


def _setup(
    model_config: HRMConfig, config: TrainConfig, resume: str | None, dist_info: Distributed, start: Start
) -> _Setup:
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
    optimizer, emb_opt = _build_optimizers(model, config, fused=device.type == "cuda")
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
    return _Setup(model, step_model, optimizer, emb_opt, device, position, carry, ema)


def _diverged(
    loss: torch.Tensor,
    position: int,
    carry: ACTCarry | None,
    metrics: dict[str, Any],
    model: HRMACT,
    ckpt: Checkpointer,
) -> TrainingDiverged:
    """Keep the last good weights (those before this step, if finite) and say so."""
    if all(bool(torch.isfinite(p).all()) for p in model.parameters()):
        ckpt.save(ckpt.last, position, carry, metrics)
    return TrainingDiverged(
        f"the loss became {float(loss.detach())} at step {position + 1}; stopped with the last good "
        f"checkpoint {ckpt.last if ckpt.last.exists() else '(none written yet)'}; lower --lr or check the data"
    )


def _optimizer_step(
    loss: torch.Tensor, optimizer: torch.optim.Optimizer, emb_opt: PuzzleEmbeddingSignSGD | None
) -> None:
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if emb_opt:
        emb_opt.step()


def _step_metrics(
    position: int,
    lr: float,
    loss: torch.Tensor,
    sums: dict[str, float],
    rows: int,
    config: TrainConfig,
    step_s: float,
    data_s: float,
    compute_s: float,
) -> dict[str, Any]:
    count = max(1.0, sums["count"])
    return {
        "step": position,
        "lr": lr,
        "loss": float(loss.detach()) / rows,
        "count": int(sums["count"]),
        **{k: sums[k] / count for k in ("token_accuracy", "exact_accuracy", "q_halt_accuracy", "steps")},
        "samples_per_s": config.global_batch_size / max(step_s, 1e-9),
        "data_s": round(data_s, 3),
        "compute_s": round(compute_s, 3),
    }


def train(
    model_config: HRMConfig,
    config: TrainConfig,
    resume: str | None = None,
    stop_after: int | None = None,
    progress: bool = True,
    start: Start | None = None,
) -> TrainResult:
    """Train (or resume) and write ``<out_dir>/last.pt`` (+ ``step_N.pt`` every
    ``checkpoint_every``) and ``metrics.jsonl``. ``stop_after`` ends early (as if
    interrupted) after that many steps, still writing a resumable checkpoint.

    Under ``torchrun`` each rank trains its slice of every global batch in a
    DistributedDataParallel model (gradients all-reduced; the sparse puzzle-embedding
    update gathers all ranks' rows, as upstream); rank 0 writes files. ``start``: see :class:`Start`."""
    if config.threads:
        torch.set_num_threads(config.threads)
    dist_info = init_distributed(config.device)
    rows, out = dist_info.rows(config.global_batch_size), Path(config.out_dir)
    if dist_info.main:
        check_out_dir(out, config.overwrite, resume)
    with run_lock(out) if dist_info.main else contextlib.nullcontext():  # one writer per run folder
        return _train(model_config, config, resume, stop_after, progress, dist_info, rows, out, start or Start())


def _train(
    model_config: HRMConfig,
    config: TrainConfig,
    resume: str | None,
    stop_after: int | None,
    progress: bool,
    dist_info: Distributed,
    rows: int,
    out: Path,
    start: Start,
) -> TrainResult:
    """The training loop of :func:`train`, run while the run folder's lock is held: data, model,
    then one visible step loop with its checkpoints, then the final evaluation."""
    train_split, test_split = _load_splits(model_config, config)
    sampler = EpochSampler(train_split, config.global_batch_size, config.seed)
    example_pids = train_split.example_puzzle_ids()
    run = _setup(model_config, config, resume, dist_info, start)
    model, optimizer, emb_opt = run.model, run.optimizer, run.emb_opt
    device, position, carry = run.device, run.position, run.carry
    out.mkdir(parents=True, exist_ok=True)
    if resume and dist_info.main:  # the log continues exactly where the checkpoint left off
        rewind_metrics(out, position)
    sinks = MetricSinks(config.log_to if dist_info.main else (), str(out), dataclasses.asdict(config))
    end = config.steps if stop_after is None else min(config.steps, position + stop_after)
    bar = _ProgressBar(progress and dist_info.main, config.steps, position)
    data_time = compute_time = 0.0
    last_metrics: dict[str, Any] = {}
    # Under DDP the averaged gradient is (1/world) sum over ranks; scaling by world / global
    # batch gives upstream's sum of per-example losses over the global batch.
    loss_scale = dist_info.world / config.global_batch_size
    stop, ckpt = StopRequest(), Checkpointer(out, config, dist_info, model, optimizer, emb_opt, run.ema)
    try:
        stop.__enter__()
        while position < end and not agree(stop.signal is not None or start.over(position), dist_info, device):
            t0 = time.perf_counter()
            idx = dist_info.my_rows(sampler.batch_at(position), rows)
            batch = to_batch(train_split, idx, train_split.metadata.ignore_label_id, example_pids, device)
            t1 = time.perf_counter()
            carry = model.initial_carry(batch) if carry is None else carry
            lr = _set_lrs(position, config, optimizer, emb_opt)
            carry, outputs = run.step_model(carry, batch)
            loss, metrics = act_loss(outputs, carry.current_data["labels"], carry.halted, carry.steps, config.loss_type)
            if agree(not bool(torch.isfinite(loss.detach())), dist_info, device):
                raise _diverged(loss, position, carry, last_metrics, model, ckpt)
            _optimizer_step(loss * loss_scale, optimizer, emb_opt)
            if run.ema is not None:
                run.ema.update(model)
            position += 1
            sums = reduce_metrics(metrics, dist_info)  # also the per-step host sync for honest timing
            t2 = time.perf_counter()
            data_time, compute_time = data_time + t1 - t0, compute_time + t2 - t1
            last_metrics = _step_metrics(position, lr, loss, sums, rows, config, t2 - t0, data_time, compute_time)
            if config.eval_every and position % config.eval_every == 0 and position < config.steps:
                last_metrics["eval"] = _evaluate_on_main(run.eval_model(), test_split, config.eval_samples, dist_info)
            if dist_info.main:
                append_line(out / "metrics.jsonl", json.dumps(last_metrics))
                sinks.log(last_metrics)
            bar.update(last_metrics)
            ckpt.after_step(position, carry, last_metrics, end, device)
    except torch.cuda.OutOfMemoryError:
        raise _out_of_memory(config, dist_info, out) from None
    finally:
        stop.__exit__()
        bar.stop()
        sinks.close()
    if stop.signal is None and position >= config.steps:
        with display.Stages(quiet=not (progress and dist_info.main)).stage("final evaluation on the test split"):
            last_metrics["eval"] = _evaluate_on_main(run.eval_model(), test_split, None, dist_info)  # full, at the end
        last_metrics["timing"] = {"data_s": data_time, "compute_s": compute_time}
        if dist_info.main:
            append_line(out / "metrics.jsonl", json.dumps({"final": last_metrics}))
    result = TrainResult(ckpt.save(ckpt.last, position, carry, last_metrics), last_metrics, stop.signal is not None)
    # The DDP wrapper's reducer holds the process group, and DDP sits in reference cycles: left to
    # the collector at interpreter exit, gloo's threads were torn down during finalization and a
    # rank could abort ("terminate called without an active exception"). Free it now, while
    # Python is fully alive, so destroy_process_group releases the group's last reference.
    del run, ckpt
    gc.collect()
    shutdown(dist_info)
    return result


def _evaluate_on_main(model: HRMACT, split: Split, samples: int | None, dist_info: Distributed) -> dict[str, float]:
    """Rank 0 evaluates; the others wait for it."""
    result = evaluate(model, split, samples) if dist_info.main else {}
    barrier(dist_info)
    return result
