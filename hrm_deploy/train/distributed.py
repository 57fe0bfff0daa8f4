"""Distributed helpers: where this process sits in a torchrun job and the collectives the
trainer needs. With one process every helper is a no-op, so the loop reads the same."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from hrm_deploy.errors import ConfigError


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
    if not dist.is_initialized():
        use_cuda = device_name != "cpu" and torch.cuda.is_available()
        if use_cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return Distributed(dist.get_rank(), dist.get_world_size(), local_rank)


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
    """Leave the process group cleanly: every rank waits for the others, then the group is
    destroyed. Exiting with gloo's threads still running aborts the process ("terminate called
    without an active exception", SIGABRT) when one rank finishes before another."""
    if dist_info.world > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
