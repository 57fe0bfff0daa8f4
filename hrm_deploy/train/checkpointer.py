"""Checkpoints that never lose work: the run folder guard, the signal catcher and the
``Checkpointer`` (``step_N.pt`` every N steps, ``last.pt`` every few minutes, on a signal and
at the end). Rank 0 writes; every rank takes part in the collectives a save needs."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from hrm_deploy.errors import ConfigError
from hrm_deploy.io import check_output_path
from hrm_deploy.model.checkpoint import save_checkpoint, write_upstream_run
from hrm_deploy.model.hrm import ACTCarry
from hrm_deploy.train.distributed import Distributed, agree
from hrm_deploy.train.ema import EMA
from hrm_deploy.train.optim import PuzzleEmbeddingSignSGD
from hrm_deploy.train.state import carry_state, rng_state

RUN_FILES = ("last.pt", "metrics.jsonl")
LOCK_NAME = ".train.lock"


@contextlib.contextmanager
def run_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``<out>/.train.lock`` while a run (``train``, or ``adapt``, which
    trains with the same loop) writes its folder: a second run of the same folder (a double ``--resume``) is refused in one line naming the holder's
    pid, instead of interleaving checkpoints and metrics. The kernel drops the lock when the
    holder dies, so a killed run never blocks the next one."""
    import fcntl
    import os

    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_NAME
    if path.is_dir() and not path.is_symlink():  # not ours to remove: say what it is and what to do
        raise ConfigError(
            f"{path} is a folder where train and adapt keep their run lock (a file); remove or rename that folder, "
            "or pick another --out"
        )
    check_output_path(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ConfigError(
                f"{out} is being written by another run of train or adapt (pid {holder}); wait for it to finish, "
                "stop it, or pick another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)


def check_out_dir(out: Path, overwrite: bool, resume: str | None) -> None:
    """Refuse to replace another run's files unless asked to (``--resume`` or ``--overwrite``)."""
    check_output_path(out / "last.pt")
    existing = [out / n for n in RUN_FILES if (out / n).exists()] + sorted(out.glob("step_*.pt"))
    if not existing:
        return
    if overwrite:
        for path in existing:
            path.unlink()
        return
    if resume is None:
        checkpoints = [p for p in existing if p.suffix == ".pt"]
        if not checkpoints:  # e.g. a first run stopped by a full disk before its first checkpoint
            raise ConfigError(
                f"{out} holds a run with no checkpoint to resume ({existing[0].name} only); "
                "start over with --overwrite, or pick another --out"
            )
        newest = out / "last.pt" if (out / "last.pt") in checkpoints else max(checkpoints, key=_step_number)
        raise ConfigError(
            f"{out} already holds a run ({existing[0].name}); continue it with --resume "
            f"{newest}, start over with --overwrite, or pick another --out"
        )


def _step_number(path: Path) -> int:
    digits = path.stem.rpartition("_")[2]
    return int(digits) if digits.isdigit() else -1


def rewind_metrics(out: Path, position: int) -> int:
    """On resume from step ``position``: drop the ``metrics.jsonl`` lines of steps after it (written
    after that checkpoint, before the run stopped) and a torn last line, so the log continues
    exactly where the checkpoint left off with no step twice. Atomic; returns the lines dropped."""
    import json

    from hrm_deploy.io import write_text

    log = out / "metrics.jsonl"
    if not log.is_file():
        return 0
    lines = log.read_text(errors="replace").splitlines()
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line torn by a kill mid-write
        step = (record.get("final") or record).get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and step <= position:
            kept.append(line)
    if len(kept) != len(lines):
        write_text(log, "".join(line + "\n" for line in kept))
    return len(lines) - len(kept)


class StopRequest:
    """SIGINT/SIGTERM during training: finish the step, checkpoint, stop cleanly. A second
    signal interrupts at once (the last checkpoint stays)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
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


class Checkpointer:
    """Writes trainer checkpoints of one run: weights, optimizers, RNG state and the ACT carry
    (resumable bit for bit), ``step_N.pt`` every ``checkpoint_every`` steps and ``last.pt``
    at least every ``checkpoint_minutes`` (a kill -9 loses at most that much)."""

    def __init__(
        self,
        out: Path,
        config: Any,
        dist_info: Distributed,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        emb_opt: PuzzleEmbeddingSignSGD | None,
        ema: EMA | None = None,
    ):
        self.out, self.config, self.dist_info = out, config, dist_info
        self.model, self.optimizer, self.emb_opt, self.ema = model, optimizer, emb_opt, ema
        self.last = out / "last.pt"
        self._last_save = time.monotonic()

    def save(self, path: Path, position: int, carry: ACTCarry | None, metrics: dict | None = None) -> Path:
        """Write ``path`` (collective: call it on every rank)."""
        carry_saved = carry_state(carry, self.dist_info)  # collective: every rank takes part
        if self.dist_info.main:
            config = dataclasses.asdict(self.config)
            # With EMA the checkpoint's weights are the average (what upstream saves and evaluates);
            # the live weights ride along for --resume.
            weights = self.ema.copy_of(self.model) if self.ema is not None else self.model
            core: Any = getattr(self.model, "inner", self.model)
            live = {"live_state": {k: v.detach().cpu() for k, v in core.state_dict().items()}}
            save_checkpoint(
                path,
                weights,
                step=position,
                train_config=config,
                optimizer=self.optimizer.state_dict(),
                puzzle_emb_optimizer=self.emb_opt.state_dict() if self.emb_opt else None,
                rng=rng_state(),
                carry=carry_saved,
                metrics=metrics or {},
                world_size=self.dist_info.world,
                **(live if self.ema is not None else {}),
            )
            if self.config.export_upstream:
                write_upstream_run(
                    self.out / "upstream",
                    weights,
                    step=position,
                    data_path=str(self.config.data_path),
                    train_config=config,
                    loss_type=self.config.loss_type,
                )
        return path

    def after_step(
        self, position: int, carry: ACTCarry | None, metrics: dict, end: int, device: torch.device | None = None
    ) -> None:
        """The periodic checkpoints due after step ``position`` (of a session ending at ``end``)."""
        if self.config.checkpoint_every and position % self.config.checkpoint_every == 0:
            self.save(self.out / f"step_{position}.pt", position, carry, metrics)
        minutes = self.config.checkpoint_minutes
        due = bool(minutes) and time.monotonic() - self._last_save >= 60 * minutes
        if agree(due, self.dist_info, device) and position < end:
            self.save(self.last, position, carry, metrics)  # the final save follows at ``end`` anyway
            self._last_save = time.monotonic()


def written_by_us(path: str) -> bool:
    """Whether ``path`` is a checkpoint file in hrm-deploy's own format (False if unreadable)."""
    from hrm_deploy.model.checkpoint import CHECKPOINT_FORMAT, _torch_load
    from hrm_deploy.sources import resolve_checkpoint_path

    try:
        obj = _torch_load(resolve_checkpoint_path(path))
    except Exception:  # noqa: BLE001 - unreadable: not ours to describe further
        return False
    return isinstance(obj, dict) and obj.get("format") == CHECKPOINT_FORMAT
