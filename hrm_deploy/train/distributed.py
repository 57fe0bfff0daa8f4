"""Distributed helpers: where this process sits in a torchrun job and the collectives the
trainer needs. With one process every helper is a no-op, so the loop reads the same."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from hrm_deploy.errors import ConfigError, HRMDeployError

T = TypeVar("T")


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
    """This process's place in a torchrun job (rank 0 of 1 without torchrun). ``owner``: this
    process joined the group here, so :func:`shutdown` leaves it; a group a caller joined first
    (``adapt`` around ``train``) is the caller's to leave, after its own last collective."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owner: bool = True

    @property
    def main(self) -> bool:
        return self.rank == 0

    def rows(self, global_batch: int) -> int:
        """This rank's share of a global batch (a clear error when it does not split evenly)."""
        if global_batch % self.world:
            raise ConfigError(
                f"global batch {global_batch} does not split over {self.world} "
                "processes; choose a multiple of the process count"
            )
        return global_batch // self.world

    def my_rows(self, batch_idx, rows: int):
        """This rank's slice of the global batch's example indices."""
        return batch_idx[self.rank * rows : (self.rank + 1) * rows]


def init_distributed(device_name: str) -> Distributed:
    """Join the process group torchrun describes in the environment (NCCL on GPUs, gloo on CPU)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Distributed()
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    owner = not dist.is_initialized()
    if owner:
        use_cuda = device_name != "cpu" and torch.cuda.is_available()
        if use_cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return Distributed(dist.get_rank(), dist.get_world_size(), local_rank, owner)


def on_main(work: Callable[[], T], dist_info: Distributed) -> T:
    """Run ``work`` on rank 0 alone and hand its (picklable) result to every rank, which wait for
    it: what must happen once, such as writing a dataset the others then read. A user error on
    rank 0 is raised on every rank with the same message, so all ranks stop together instead of
    waiting forever at the next collective; any other failure keeps its traceback on rank 0."""
    if dist_info.world == 1:
        return work()
    import torch.distributed as dist

    box: list[Any] = [None]
    if dist_info.main:
        try:
            value = work()
        except HRMDeployError as exc:
            box[0] = ("error", type(exc), str(exc))
            dist.broadcast_object_list(box, src=0)
            raise
        except BaseException as exc:
            box[0] = ("error", RuntimeError, f"rank 0 failed ({type(exc).__name__}: {exc}); see its traceback")
            dist.broadcast_object_list(box, src=0)
            raise
        box[0] = ("value", value)
        dist.broadcast_object_list(box, src=0)
        return value
    dist.broadcast_object_list(box, src=0)
    if box[0][0] == "value":
        return box[0][1]
    _, kind, message = box[0]
    try:
        error = kind(message)
    except TypeError:  # a constructor that takes more than the message
        error = HRMDeployError(message) if issubclass(kind, HRMDeployError) else RuntimeError(message)
    raise error from None


def gather_rows(t: torch.Tensor, dist_info: Distributed) -> torch.Tensor:
    """Concatenate every rank's rows (rank order) so the saved carry is the global batch's."""
    if dist_info.world == 1:
        return t
    import torch.distributed as dist

    parts = [torch.empty_like(t) for _ in range(dist_info.world)]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


def agree(flag: bool, dist_info: Distributed, device: torch.device | None = None) -> bool:
    """True when any rank says so (a signal or NaN on one rank stops all ranks together)."""
    if dist_info.world == 1:
        return flag
    import torch.distributed as dist

    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


METRIC_SUMS = ("count", "token_accuracy", "exact_accuracy", "q_halt_accuracy", "steps")


def reduce_metrics(metrics: dict[str, torch.Tensor], dist_info: Distributed) -> dict[str, float]:
    """Sum the per-rank metric sums over all ranks (also the step's host sync)."""
    stacked = torch.stack([metrics[k].detach().float() for k in METRIC_SUMS])
    if dist_info.world > 1:
        import torch.distributed as dist

        dist.all_reduce(stacked)
    return dict(zip(METRIC_SUMS, stacked.tolist()))


def barrier(dist_info: Distributed) -> None:
    if dist_info.world > 1:
        torch.distributed.barrier()


def shutdown(dist_info: Distributed) -> None:
    """Leave the process group cleanly, when this process joined it here (``owner``): every rank
    waits for the others, then the group is destroyed. Exiting with gloo's threads still running aborts the process ("terminate called
    without an active exception", SIGABRT) when one rank finishes before another."""
    if dist_info.world > 1 and dist_info.owner:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
