"""What the trainer feeds the model: upstream-style epoch sampling and batch assembly."""

from __future__ import annotations

import numpy as np
import torch

from hrm_deploy.data.format import Split
from hrm_deploy.errors import DataError
from hrm_deploy.metrics import IGNORE_LABEL_ID


class EpochSampler:
    """Deterministic upstream-style sampling: each epoch visits every group once in a
    seeded order, taking a random puzzle of the group and a random example of it."""

    def __init__(self, split: Split, batch: int, seed: int):
        self.split, self.batch, self.seed = split, batch, seed
        self.groups = len(split.group_indices) - 1
        self._cached: tuple[int, np.ndarray] | None = None  # (epoch, example order)
        if self.groups < batch:
            raise DataError(
                f"the train split has {self.groups} puzzle groups, fewer than the global batch "
                f"{batch}; lower --batch-size or generate more puzzles"
            )

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
        return self._cached[1][index * self.batch : (index + 1) * self.batch]


def to_batch(
    split: Split,
    idx: np.ndarray,
    ignore_label_id: int | None,
    example_pids: np.ndarray | None = None,
    device: torch.device | None = None,
) -> dict[str, torch.Tensor]:
    """Rows ``idx`` of ``split`` as the model's batch dict (labels' ignore id mapped to ours)."""
    labels = torch.from_numpy(np.asarray(split.labels[idx]).astype(np.int64))
    if ignore_label_id is not None:
        labels = torch.where(labels == ignore_label_id, IGNORE_LABEL_ID, labels)
    pids = (example_pids if example_pids is not None else split.example_puzzle_ids())[idx]
    batch = {
        "inputs": torch.from_numpy(np.asarray(split.inputs[idx]).astype(np.int64)),
        "labels": labels,
        "puzzle_identifiers": torch.from_numpy(pids.astype(np.int64)),
    }
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()} if device is not None else batch
