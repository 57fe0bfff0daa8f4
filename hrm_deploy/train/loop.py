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
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hrm_deploy.data.format import Split, check_fits_model, load_split, select_examples
from hrm_deploy.errors import CheckpointError, ConfigError, DataError, HRMDeployError
from hrm_deploy.io import append_line, check_output_path
from hrm_deploy.model.checkpoint import model_from_contents, read_checkpoint, save_checkpoint, write_upstream_run
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.hrm import ACTCarry, Carry, HRMACT, build_model
from hrm_deploy.train.losses import IGNORE_LABEL_ID, act_loss
from hrm_deploy.train.optim import AdamATan2, PuzzleEmbeddingSignSGD
from hrm_deploy.train.sinks import MetricSinks


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
    log_to: tuple[str, ...] = ()  # extra metric sinks: "tensorboard", "wandb" (rank 0)
    version: int = 1

    def __post_init__(self) -> None:
        if self.optimizer not in ("adam_atan2", "adamw"):
            raise ConfigError(f"optimizer {self.optimizer!r} unknown; use adam_atan2 or adamw")
        if self.loss_type not in ("stablemax_cross_entropy", "softmax_cross_entropy"):
            raise ConfigError(f"loss_type {self.loss_type!r} unknown")
        if self.steps < 1 or self.global_batch_size < 1:
            raise ConfigError("steps and global_batch_size must be >= 1")
        finite = {"lr": self.lr, "puzzle_emb_lr": self.puzzle_emb_lr, "weight_decay": self.weight_decay,
                  "puzzle_emb_weight_decay": self.puzzle_emb_weight_decay, "checkpoint_minutes": self.checkpoint_minutes}
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
        if self.eval_samples < 1:
            raise ConfigError(f"eval_samples must be >= 1, got {self.eval_samples}")


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


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto``: CUDA when available. Under torchrun each rank takes GPU ``LOCAL_RANK``."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} asked for but torch sees no CUDA GPU; use --device cpu")
    if name == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(name)


@dataclass(frozen=True)
class Distributed:
    """This process's place in a torchrun job (rank 0 of 1 without torchrun)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device_name: str) -> Distributed:
    """Join the process group torchrun describes in the environment (NCCL on GPUs, gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Distributed()
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        use_cuda = device_name != "cpu" and torch.cuda.is_available()
        if use_cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return Distributed(dist.get_rank(), dist.get_world_size(), local_rank)


def _gather_rows(t: torch.Tensor, dist_info: Distributed) -> torch.Tensor:
    """Concatenate every rank's rows (rank order) so the saved carry is the global batch's."""
    if dist_info.world == 1:
        return t
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(dist_info.world)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


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


def _carry_state(carry: ACTCarry | None, dist_info: Distributed) -> dict[str, Any] | None:
    if carry is None:
        return None
    state = {"z_H": carry.inner.z_H, "z_L": carry.inner.z_L, "steps": carry.steps, "halted": carry.halted,
             **{f"data.{k}": v for k, v in carry.current_data.items()}}
    return {k: _gather_rows(v, dist_info).cpu() for k, v in state.items()}


def _carry_from(state: dict[str, Any] | None, device: torch.device, dist_info: Distributed) -> ACTCarry | None:
    """This rank's rows of a saved global-batch carry."""
    if state is None:
        return None
    rows = len(state["steps"]) // dist_info.world
    state = {k: v[dist_info.rank * rows:(dist_info.rank + 1) * rows].to(device) for k, v in state.items()}
    data = {k[5:]: v for k, v in state.items() if k.startswith("data.")}
    return ACTCarry(Carry(state["z_H"], state["z_L"]), state["steps"], state["halted"], data)


@dataclass
class TrainResult:
    checkpoint: Path
    metrics: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False  # stopped by SIGINT/SIGTERM; ``checkpoint`` resumes it


class TrainingDiverged(HRMDeployError):
    """The loss became NaN/inf; the last good checkpoint is kept."""


RUN_FILES = ("last.pt", "metrics.jsonl")


def _check_out_dir(out: Path, config: TrainConfig, resume: str | None) -> None:
    """Refuse to replace another run's files unless asked to (``--resume`` or ``--overwrite``)."""
    check_output_path(out / "last.pt")
    existing = [out / n for n in RUN_FILES if (out / n).exists()] + sorted(out.glob("step_*.pt"))
    if not existing:
        return
    if config.overwrite:
        for path in existing:
            path.unlink()
        return
    if resume is None:
        raise ConfigError(f"{out} already holds a run ({existing[0].name}); continue it with --resume "
                          f"{out / 'last.pt'}, start over with --overwrite, or pick another --out")


def _check_splits(train_split: Split, test_split: Split, vocab_size: int, where: str) -> None:
    """Labels must be token ids of the vocabulary (or the ignore label); the test split must not be empty."""
    for name, split in (("train", train_split), ("test", test_split)):
        if len(split) == 0:
            raise DataError(f"{where}: the {name} split holds no examples; regenerate the dataset with a non-empty "
                            f"{name} split (accuracy on 0 examples means nothing)")
        ignore = split.metadata.ignore_label_id
        for start in range(0, len(split), 65536):  # chunks: the arrays are memory-mapped and may be large
            labels = np.asarray(split.labels[start:start + 65536])
            valid = (labels >= 0) & (labels < vocab_size)
            if ignore is not None:
                valid |= labels == ignore
            if valid.all():
                continue
            bad = int(labels[~valid].flat[0])
            raise DataError(f"{where}: the {name} split has label {bad}, outside the vocabulary [0, {vocab_size}) "
                            "and not the ignore label; the dataset is damaged or built for another vocabulary")


class _StopRequest:
    """SIGINT/SIGTERM during training: finish the step, checkpoint, stop cleanly. A second
    signal interrupts at once (the last checkpoint stays)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "_StopRequest":
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None:
            raise KeyboardInterrupt
        self.signal = signum

    def __exit__(self, *exc: Any) -> None:
        import signal

        for sig, old in self._old.items():
            signal.signal(sig, old)


def _build_optimizers(model: HRMACT, config: TrainConfig, fused: bool):
    params = list(model.parameters())
    betas = (config.beta1, config.beta2)
    if config.optimizer == "adamw":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(params, lr=0.0, betas=betas,
                                                             weight_decay=config.weight_decay,
                                                             **({"fused": True} if fused else {}))
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
        emb_opt.param_groups[0]["lr"] = lr_at(position, config.puzzle_emb_lr, config.lr_warmup_steps,
                                              config.steps, config.lr_min_ratio)
    return lr


def _reduce_metrics(metrics: dict[str, torch.Tensor], dist_info: Distributed) -> dict[str, float]:
    keys = ("count", "accuracy", "exact_accuracy", "q_halt_accuracy", "steps")
    stacked = torch.stack([metrics[k].detach().float() for k in keys])
    if dist_info.world > 1:
        import torch.distributed as dist

        dist.all_reduce(stacked)
    return dict(zip(keys, stacked.tolist()))


class _ProgressBar:
    """Rich progress bar with samples/s, data-wait vs compute split and ETA (rank 0 only)."""

    def __init__(self, enabled: bool, total: int, completed: int):
        self.bar = None
        if not enabled:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                            TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
        self.bar.start()
        self.task = self.bar.add_task("train", total=total, completed=completed, info="")

    def update(self, row: dict[str, Any]) -> None:
        if self.bar is None:
            return
        info = (f"loss {row['loss']:.3f} acc {row['accuracy']:.3f} {row['samples_per_s']:.0f} samples/s "
                f"(data {row['data_s']:.0f}s, compute {row['compute_s']:.0f}s)")
        if "eval" in row:
            info += f" eval exact {row['eval']['exact_accuracy']:.3f}"
        self.bar.update(self.task, completed=row["step"], info=info)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _out_of_memory(config: TrainConfig, dist_info: Distributed, out: Path) -> ConfigError:
    smaller = max(dist_info.world, config.global_batch_size // 2)
    return ConfigError(f"out of GPU memory at global batch {config.global_batch_size}; retry with --batch-size "
                       f"{smaller} (and --resume {out / 'last.pt'} if it exists), or a smaller model")


def _agree(flag: bool, dist_info: Distributed, device: torch.device | None = None) -> bool:
    """True when any rank says so (a signal or NaN on one rank stops all ranks together)."""
    if dist_info.world == 1:
        return flag
    import torch.distributed as dist

    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def train(model_config: HRMConfig, config: TrainConfig, resume: str | None = None,
          stop_after: int | None = None, progress: bool = True) -> TrainResult:
    """Train (or resume) and write ``<out_dir>/last.pt`` (+ ``step_N.pt`` every
    ``checkpoint_every``) and ``metrics.jsonl``. ``stop_after`` ends early (as if
    interrupted) after that many steps, still writing a resumable checkpoint.

    Under ``torchrun`` each rank trains its slice of every global batch in a
    DistributedDataParallel model (gradients all-reduced; the sparse puzzle-embedding
    update gathers all ranks' rows, as upstream); rank 0 writes files."""
    if config.threads:
        torch.set_num_threads(config.threads)
    dist_info = init_distributed(config.device)
    if config.global_batch_size % dist_info.world:
        raise ConfigError(f"global batch {config.global_batch_size} does not split over {dist_info.world} "
                          "processes; choose a multiple of the process count")
    rows = config.global_batch_size // dist_info.world
    out = Path(config.out_dir)
    if dist_info.main:
        _check_out_dir(out, config, resume)
    train_split = load_split(config.data_path, "train")
    test_split = load_split(config.data_path, "test")
    check_fits_model(train_split.metadata, model_config, config.data_path)
    _check_splits(train_split, test_split, model_config.vocab_size, config.data_path)
    sampler = EpochSampler(train_split, config.global_batch_size, config.seed)
    example_pids = train_split.example_puzzle_ids()

    position, carry_state = 0, None
    if resume:
        contents = read_checkpoint(resume)
        if contents.kind != "hrm-deploy" or not all(k in contents.extra for k in ("optimizer", "rng")):
            raise CheckpointError(f"{resume} is not a trainer checkpoint (it has weights but no optimizer and "
                                  "random state, e.g. an upstream step_N or a bundled preset); --resume takes a "
                                  "last.pt/step_N.pt written by hrm-deploy train")
        model = model_from_contents(contents)
        if contents.config != model_config:
            raise ConfigError(f"{resume} was trained with a different model config; resume it without overrides")
        position = int(contents.step or 0)
        carry_state = contents.extra.get("carry")
    else:
        model = build_model(model_config, seed=config.seed)
        random.seed(config.seed)
        np.random.seed(config.seed)
        torch.manual_seed(config.seed + dist_info.rank)  # exploration draws differ per rank
    device = resolve_device(config.device, dist_info.local_rank)
    if device.type == "cuda" and config.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model.to(device).train()
    optimizer, emb_opt = _build_optimizers(model, config, fused=device.type == "cuda")
    if resume:
        optimizer.load_state_dict(contents.extra["optimizer"])
        if emb_opt is not None and contents.extra.get("puzzle_emb_optimizer"):
            emb_opt.load_state_dict(contents.extra["puzzle_emb_optimizer"])
        _set_rng_state(contents.extra["rng"])
    carry = _carry_from(carry_state, device, dist_info)
    if config.compile:
        model.inner.compile()  # in place: state-dict keys stay upstream's
    step_model: torch.nn.Module = model
    if dist_info.world > 1:
        from torch.nn.parallel import DistributedDataParallel

        step_model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)

    def save(path: Path, metrics: dict | None = None) -> Path:
        carry_saved = _carry_state(carry, dist_info)  # collective: every rank takes part
        if dist_info.main:
            save_checkpoint(path, model, step=position, train_config=dataclasses.asdict(config),
                            optimizer=optimizer.state_dict(),
                            puzzle_emb_optimizer=emb_opt.state_dict() if emb_opt else None,
                            rng=_rng_state(), carry=carry_saved, metrics=metrics or {},
                            world_size=dist_info.world)
            if config.export_upstream:
                write_upstream_run(out / "upstream", model, step=position, data_path=str(config.data_path),
                                   train_config=dataclasses.asdict(config), loss_type=config.loss_type)
        return path

    def run_eval(samples: int | None) -> dict[str, float]:
        result = evaluate(model, test_split, samples) if dist_info.main else {}
        if dist_info.world > 1:
            torch.distributed.barrier()
        return result

    out.mkdir(parents=True, exist_ok=True)
    sinks = MetricSinks(config.log_to if dist_info.main else (), str(out), dataclasses.asdict(config))
    log = dist_info.main
    end = config.steps if stop_after is None else min(config.steps, position + stop_after)
    bar = _ProgressBar(progress and dist_info.main, config.steps, position)
    data_time = compute_time = 0.0
    last_metrics: dict[str, Any] = {}
    # Under DDP the averaged gradient is (1/world) sum over ranks; scaling by world / global
    # batch gives upstream's sum of per-example losses over the global batch.
    loss_scale = dist_info.world / config.global_batch_size
    stop = _StopRequest()
    last_save = time.monotonic()
    last_good = out / "last.pt"
    try:
        stop.__enter__()
        while position < end:
            if _agree(stop.signal is not None, dist_info, device):
                break
            t0 = time.perf_counter()
            idx = sampler.batch_at(position)[dist_info.rank * rows:(dist_info.rank + 1) * rows]
            batch = to_batch(train_split, idx, train_split.metadata.ignore_label_id, example_pids, device)
            t1 = time.perf_counter()
            if carry is None:
                carry = model.initial_carry(batch)
            lr = _set_lrs(position, config, optimizer, emb_opt)
            carry, outputs = step_model(carry, batch)
            loss, metrics = act_loss(outputs, carry.current_data["labels"], carry.halted, carry.steps, config.loss_type)
            if _agree(not bool(torch.isfinite(loss.detach())), dist_info, device):
                # weights are still those of the last good step; keep them if they are finite
                if all(bool(torch.isfinite(p).all()) for p in model.parameters()):
                    save(last_good, last_metrics)
                raise TrainingDiverged(
                    f"the loss became {float(loss.detach())} at step {position + 1}; stopped with the last good "
                    f"checkpoint {last_good if last_good.exists() else '(none written yet)'}; lower --lr or "
                    "check the data")
            optimizer.zero_grad(set_to_none=True)
            (loss * loss_scale).backward()
            optimizer.step()
            if emb_opt:
                emb_opt.step()
            position += 1
            sums = _reduce_metrics(metrics, dist_info)  # also the per-step host sync for honest timing
            t2 = time.perf_counter()
            data_time += t1 - t0
            compute_time += t2 - t1
            count = max(1.0, sums["count"])
            last_metrics = {"step": position, "lr": lr, "loss": float(loss.detach()) / rows,
                            "count": int(sums["count"]),
                            **{k: sums[k] / count for k in ("accuracy", "exact_accuracy", "q_halt_accuracy", "steps")},
                            "samples_per_s": config.global_batch_size / max(t2 - t0, 1e-9),
                            "data_s": round(data_time, 3), "compute_s": round(compute_time, 3)}
            if config.eval_every and position % config.eval_every == 0 and position < config.steps:
                last_metrics["eval"] = run_eval(config.eval_samples)
            if log:
                append_line(out / "metrics.jsonl", json.dumps(last_metrics))
                sinks.log(last_metrics)
            bar.update(last_metrics)
            if config.checkpoint_every and position % config.checkpoint_every == 0:
                save(out / f"step_{position}.pt", last_metrics)
            due = bool(config.checkpoint_minutes) and time.monotonic() - last_save >= 60 * config.checkpoint_minutes
            if _agree(due, dist_info, device) and position < end:
                save(last_good, last_metrics)  # periodic: a kill -9 loses at most checkpoint_minutes
                last_save = time.monotonic()
    except torch.cuda.OutOfMemoryError:
        raise _out_of_memory(config, dist_info, out) from None
    finally:
        stop.__exit__()
        bar.stop()
        sinks.close()
    if stop.signal is not None:
        return TrainResult(save(last_good, last_metrics), last_metrics, interrupted=True)
    if position >= config.steps:
        last_metrics["eval"] = run_eval(None)  # full evaluation at the end
        last_metrics["timing"] = {"data_s": data_time, "compute_s": compute_time}
        if dist_info.main:
            append_line(out / "metrics.jsonl", json.dumps({"final": last_metrics}))
    return TrainResult(save(out / "last.pt", last_metrics), last_metrics)
