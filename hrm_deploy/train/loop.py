"""The training loop (nanoGPT-shaped: one loop, one config, self-describing checkpoints).

One optimizer *step* is one ACT segment on one global batch. The ACT carry persists
across steps (upstream ``pretrain.py``): only rows that halted take new examples from
the incoming batch, so one example stays in the batch for up to ``halt_max_steps``
steps. Epochs are counted in examples drawn: one epoch visits every puzzle group once.

The config is :mod:`hrm_deploy.train.config`'s; what a run starts from (data, model, optimizers,
a resumed checkpoint's state) is :mod:`hrm_deploy.train.setup`'s; this module is the loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hrm_deploy import progress as display
from hrm_deploy.data.format import Split, select_examples
from hrm_deploy.errors import ConfigError, HRMDeployError
from hrm_deploy.io import append_line
from hrm_deploy.metrics import row_scores, summary
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.hrm import HRMACT, ACTCarry
from hrm_deploy.train.checkpointer import Checkpointer, StopRequest, check_out_dir, rewind_metrics, run_lock
from hrm_deploy.train.config import OPTIMIZERS, TrainConfig
from hrm_deploy.train.distributed import (
    Distributed,
    agree,
    barrier,
    init_distributed,
    reduce_metrics,
    shutdown,
)
from hrm_deploy.train.losses import act_loss
from hrm_deploy.train.optim import PuzzleEmbeddingSignSGD
from hrm_deploy.train.sampler import EpochSampler, to_batch
from hrm_deploy.train.setup import Start, load_splits, set_up
from hrm_deploy.train.sinks import MetricSinks

log = logging.getLogger(__name__)

__all__ = [
    "OPTIMIZERS",
    "EpochSampler",
    "Start",
    "TrainConfig",
    "TrainResult",
    "TrainingDiverged",
    "evaluate",
    "lr_at",
    "to_batch",
    "train",
]


def lr_at(step: int, base: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup, then cosine down to ``min_ratio * base`` (upstream's schedule)."""
    if step < warmup:
        return base * step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return base * (min_ratio + max(0.0, (1 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))))


@torch.inference_mode()
def evaluate(
    model: HRMACT, split: Split, samples: int | None = None, batch: int = 256, advance: display.Tracker | None = None
) -> dict[str, float]:
    """Exact and token accuracy (:func:`hrm_deploy.metrics.summary`) of the fixed-step unroll
    (upstream's eval) on a subset (``samples`` None: all of ``split``). ``advance(n)`` is called
    with the puzzles of each batch done (a :func:`hrm_deploy.progress.progress` tracker)."""
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
        if advance is not None:
            advance(len(rows[0]))
    model.train(was_training)
    return summary(np.concatenate(solved), np.concatenate(token_fraction))


@dataclass
class TrainResult:
    checkpoint: Path
    metrics: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False  # stopped by SIGINT/SIGTERM; ``checkpoint`` resumes it


class TrainingDiverged(HRMDeployError):
    """The loss became NaN/inf; the last good checkpoint is kept."""


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
    train_split, test_split = load_splits(model_config, config)
    sampler = EpochSampler(train_split, config.global_batch_size, config.seed)
    example_pids = train_split.example_puzzle_ids()
    run = set_up(model_config, config, resume, dist_info, start)
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
        # the trained state is kept before the final evaluation, which runs the whole test split
        # (minutes on a Sudoku-size model on CPU): a signal or a kill during it loses no training
        kept = ckpt.save(ckpt.last, position, carry, last_metrics)
        try:  # the whole test split, with its progress and what is left
            with display.progress(
                len(test_split), "final evaluation on the test split", not (progress and dist_info.main), unit="puzzles"
            ) as advance:
                last_metrics["eval"] = _evaluate_on_main(run.eval_model(), test_split, None, dist_info, advance)
        except KeyboardInterrupt:
            if dist_info.main:
                log.warning(
                    "the final evaluation was interrupted; the trained weights (step %d) are in %s", position, kept
                )
            raise
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


def _evaluate_on_main(
    model: HRMACT, split: Split, samples: int | None, dist_info: Distributed, advance: display.Tracker | None = None
) -> dict[str, float]:
    """Rank 0 evaluates; the others wait for it."""
    result = evaluate(model, split, samples, advance=advance) if dist_info.main else {}
    barrier(dist_info)
    return result
