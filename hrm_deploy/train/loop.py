"""The training loop (nanoGPT-shaped: one loop, one config, self-describing checkpoints).

One optimizer *step* is one ACT segment on one global batch. The ACT carry persists
across steps (upstream ``pretrain.py``): only rows that halted take new examples from
the incoming batch, so one example stays in the batch for up to ``halt_max_steps``
steps. Epochs are counted in examples drawn: one epoch visits every puzzle group once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hrm_deploy.data.format import Split, check_fits_model, load_split, select_examples
from hrm_deploy.errors import ConfigError, DataError
from hrm_deploy.model.checkpoint import read_checkpoint, save_checkpoint, model_from_contents
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.hrm import ACTCarry, Carry, HRMACT, build_model
from hrm_deploy.train.losses import IGNORE_LABEL_ID, act_loss
from hrm_deploy.train.optim import AdamATan2, PuzzleEmbeddingSignSGD


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
    checkpoint_every: int = 0  # 0: only at the end
    eval_every: int = 0  # 0: only at the end
    eval_samples: int = 200  # fast evaluation subset of the test split
    threads: int = 0  # torch CPU threads (0: torch's default)
    device: str = "auto"  # auto (cuda when available), cpu, cuda, cuda:N
    version: int = 1

    def __post_init__(self) -> None:
        if self.optimizer not in ("adam_atan2", "adamw"):
            raise ConfigError(f"optimizer {self.optimizer!r} unknown; use adam_atan2 or adamw")
        if self.loss_type not in ("stablemax_cross_entropy", "softmax_cross_entropy"):
            raise ConfigError(f"loss_type {self.loss_type!r} unknown")
        if self.steps < 1 or self.global_batch_size < 1:
            raise ConfigError("steps and global_batch_size must be >= 1")


def lr_at(step: int, base: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup, then cosine down to ``min_ratio * base`` (upstream's schedule)."""
    if step < warmup:
        return base * step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return base * (min_ratio + max(0.0, (1 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))))


class EpochSampler:
    """Deterministic upstream-style sampling: each epoch visits every group once in a
    seeded order, taking a random puzzle of the group and a random example of it."""

    def __init__(self, split: Split, batch: int, seed: int):
        self.split, self.batch, self.seed = split, batch, seed
        self.groups = len(split.group_indices) - 1
        self._cached: tuple[int, np.ndarray] | None = None  # (epoch, example order)
        if self.groups < batch:
            raise DataError(f"the train split has {self.groups} puzzle groups, fewer than the global batch "
                            f"{batch}; lower --batch-size or generate more puzzles")

    def epoch_examples(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, epoch])
        g = self.split.group_indices
        p = self.split.puzzle_indices
        out = np.empty(self.groups, dtype=np.int64)
        for i, group in enumerate(rng.permutation(self.groups)):
            puzzle = rng.integers(g[group], g[group + 1])
            out[i] = rng.integers(p[puzzle], p[puzzle + 1])
        return out

    def batch_at(self, position: int) -> np.ndarray:
        per_epoch = self.groups // self.batch  # the partial last batch is dropped, as upstream
        epoch, index = divmod(position, per_epoch)
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, self.epoch_examples(epoch))
        return self._cached[1][index * self.batch:(index + 1) * self.batch]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} asked for but torch sees no CUDA GPU; use --device cpu")
    return torch.device(name)


def to_batch(split: Split, idx: np.ndarray, ignore_label_id: int | None,
             example_pids: np.ndarray | None = None, device: torch.device | None = None) -> dict[str, torch.Tensor]:
    labels = torch.from_numpy(np.asarray(split.labels[idx]).astype(np.int64))
    if ignore_label_id is not None:
        labels = torch.where(labels == ignore_label_id, IGNORE_LABEL_ID, labels)
    pids = (example_pids if example_pids is not None else split.example_puzzle_ids())[idx]
    batch = {"inputs": torch.from_numpy(np.asarray(split.inputs[idx]).astype(np.int64)),
             "labels": labels, "puzzle_identifiers": torch.from_numpy(pids.astype(np.int64))}
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()} if device is not None else batch


@torch.inference_mode()
def evaluate(model: HRMACT, split: Split, samples: int | None = None, batch: int = 256) -> dict[str, float]:
    """Exact and token accuracy of the fixed-step unroll (upstream's eval) on a subset."""
    from hrm_deploy.export.unroll import unroll

    was_training = model.training
    model.eval()
    fixed = unroll(model)
    idx = select_examples(split, samples, seed=0) if samples else np.arange(len(split))
    device = next(model.parameters()).device
    exact = tokens = count = 0.0
    for start in range(0, len(idx), batch):
        b = to_batch(split, idx[start:start + batch], split.metadata.ignore_label_id, device=device)
        logits = fixed(b["inputs"], b["puzzle_identifiers"])[0]
        mask = b["labels"] != IGNORE_LABEL_ID
        correct = (logits.argmax(-1) == b["labels"]) & mask
        exact += float((correct.sum(-1) == mask.sum(-1)).sum())
        tokens += float((correct.sum(-1) / mask.sum(-1).clamp_min(1)).sum())
        count += len(b["inputs"])
    model.train(was_training)
    return {"exact_accuracy": exact / max(count, 1), "accuracy": tokens / max(count, 1), "count": count}


def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    return {"python": list(random.getstate()[1]), "python_pos": random.getstate()[2],
            "numpy": torch.from_numpy(np_state[1].astype(np.int64)), "numpy_pos": int(np_state[2]),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate((3, tuple(state["python"]), state["python_pos"]))
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), state["numpy_pos"], 0, 0.0))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _carry_state(carry: ACTCarry | None) -> dict[str, Any] | None:
    if carry is None:
        return None
    return {"z_H": carry.inner.z_H, "z_L": carry.inner.z_L, "steps": carry.steps, "halted": carry.halted,
            **{f"data.{k}": v for k, v in carry.current_data.items()}}


def _carry_from(state: dict[str, Any] | None, device: torch.device) -> ACTCarry | None:
    if state is None:
        return None
    state = {k: v.to(device) for k, v in state.items()}
    data = {k[5:]: v for k, v in state.items() if k.startswith("data.")}
    return ACTCarry(Carry(state["z_H"], state["z_L"]), state["steps"], state["halted"], data)


@dataclass
class TrainResult:
    checkpoint: Path
    metrics: dict[str, Any] = field(default_factory=dict)


def train(model_config: HRMConfig, config: TrainConfig, resume: str | None = None,
          stop_after: int | None = None, progress: bool = True) -> TrainResult:
    """Train (or resume) and write ``<out_dir>/last.pt`` (+ ``step_N.pt`` every
    ``checkpoint_every``) and ``metrics.jsonl``. ``stop_after`` ends early (as if
    interrupted) after that many steps, still writing a resumable checkpoint."""
    if config.threads:
        torch.set_num_threads(config.threads)
    out = Path(config.out_dir)
    train_split = load_split(config.data_path, "train")
    test_split = load_split(config.data_path, "test")
    check_fits_model(train_split.metadata, model_config, config.data_path)
    sampler = EpochSampler(train_split, config.global_batch_size, config.seed)
    example_pids = train_split.example_puzzle_ids()

    position, carry_state = 0, None
    if resume:
        contents = read_checkpoint(resume)
        model = model_from_contents(contents)
        if contents.config != model_config:
            raise ConfigError(f"{resume} was trained with a different model config; resume it without overrides")
        position = int(contents.step or 0)
        carry_state = contents.extra.get("carry")
    else:
        torch.manual_seed(config.seed)
        random.seed(config.seed)
        np.random.seed(config.seed)
        model = build_model(model_config, seed=config.seed)
    device = resolve_device(config.device)
    model.to(device).train()
    params = list(model.parameters())
    if config.optimizer == "adamw":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(params, lr=0.0, betas=(config.beta1, config.beta2),
                                                             weight_decay=config.weight_decay)
    else:
        optimizer = AdamATan2(params, lr=0.0, betas=(config.beta1, config.beta2), weight_decay=config.weight_decay)
    emb_opt = None
    if model_config.puzzle_emb_ndim > 0:
        emb_opt = PuzzleEmbeddingSignSGD(model.inner.puzzle_emb, 0.0, config.puzzle_emb_weight_decay)
    if resume:
        optimizer.load_state_dict(contents.extra["optimizer"])
        if emb_opt is not None and contents.extra.get("puzzle_emb_optimizer"):
            emb_opt.load_state_dict(contents.extra["puzzle_emb_optimizer"])
        _set_rng_state(contents.extra["rng"])
    carry = _carry_from(carry_state, device)

    def save(path: Path, metrics: dict | None = None) -> Path:
        return save_checkpoint(path, model, step=position, train_config=dataclasses.asdict(config),
                               optimizer=optimizer.state_dict(),
                               puzzle_emb_optimizer=emb_opt.state_dict() if emb_opt else None,
                               rng=_rng_state(), carry=_carry_state(carry), metrics=metrics or {})

    out.mkdir(parents=True, exist_ok=True)
    log = (out / "metrics.jsonl").open("a")
    end = config.steps if stop_after is None else min(config.steps, position + stop_after)
    bar = None
    if progress:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        bar = Progress(TextColumn("train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                       TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"), transient=False)
        bar.start()
        task = bar.add_task("train", total=config.steps, completed=position, info="")
    data_time = compute_time = 0.0
    last_metrics: dict[str, Any] = {}
    try:
        while position < end:
            t0 = time.perf_counter()
            batch = to_batch(train_split, sampler.batch_at(position), train_split.metadata.ignore_label_id, example_pids, device)
            t1 = time.perf_counter()
            if carry is None:
                carry = model.initial_carry(batch)
            lr = lr_at(position, config.lr, config.lr_warmup_steps, config.steps, config.lr_min_ratio)
            for g in optimizer.param_groups:
                g["lr"] = lr
            if emb_opt:
                emb_opt.param_groups[0]["lr"] = lr_at(position, config.puzzle_emb_lr, config.lr_warmup_steps,
                                                      config.steps, config.lr_min_ratio)
            carry, outputs = model(carry, batch)
            loss, metrics = act_loss(outputs, carry.current_data["labels"], carry.halted, carry.steps, config.loss_type)
            optimizer.zero_grad(set_to_none=True)
            (loss / config.global_batch_size).backward()
            optimizer.step()
            if emb_opt:
                emb_opt.step()
            position += 1
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # honest compute time per step
            t2 = time.perf_counter()
            data_time += t1 - t0
            compute_time += t2 - t1
            count = max(1, int(metrics["count"]))
            last_metrics = {"step": position, "lr": lr, "loss": float(loss.detach()) / config.global_batch_size,
                            "count": int(metrics["count"]),
                            **{k: float(metrics[k]) / count for k in ("accuracy", "exact_accuracy", "q_halt_accuracy", "steps")},
                            "samples_per_s": config.global_batch_size / max(t2 - t0, 1e-9),
                            "data_s": round(data_time, 3), "compute_s": round(compute_time, 3)}
            if config.eval_every and position % config.eval_every == 0 and position < config.steps:
                last_metrics["eval"] = evaluate(model, test_split, config.eval_samples)
            log.write(json.dumps(last_metrics) + "\n")
            if bar:
                info = f"loss {last_metrics['loss']:.3f} acc {last_metrics['accuracy']:.3f} " \
                       f"{last_metrics['samples_per_s']:.0f} samples/s"
                if "eval" in last_metrics:
                    info += f" eval exact {last_metrics['eval']['exact_accuracy']:.3f}"
                bar.update(task, completed=position, info=info)
            if config.checkpoint_every and position % config.checkpoint_every == 0:
                save(out / f"step_{position}.pt", last_metrics)
    finally:
        if bar:
            bar.stop()
        log.close()
    if position >= config.steps:
        last_metrics["eval"] = evaluate(model, test_split)  # full evaluation at the end
        last_metrics["timing"] = {"data_s": data_time, "compute_s": compute_time}
        with (out / "metrics.jsonl").open("a") as f:
            f.write(json.dumps({"final": last_metrics}) + "\n")
    return TrainResult(save(out / "last.pt", last_metrics), last_metrics)
