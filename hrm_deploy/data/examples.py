"""Calibration and evaluation examples: K deterministic examples from a dataset folder
(upstream format) or from a ``.npz`` of inputs, with a content hash for cache keys."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hrm_deploy.errors import DataError
from hrm_deploy.io import not_a_plain_file


@dataclass(frozen=True)
class Examples:
    """Model inputs (int32, the graphs' dtype), labels where known, and where they came from."""

    inputs: np.ndarray
    puzzle_identifiers: np.ndarray
    labels: np.ndarray | None
    source: str
    sha256: str

    def __len__(self) -> int:
        return len(self.inputs)

    def feeds(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return {"inputs": self.inputs[start:stop], "puzzle_identifiers": self.puzzle_identifiers[start:stop]}


def _digest(*arrays: np.ndarray | None) -> str:
    h = hashlib.sha256()
    for a in arrays:
        if a is not None:
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def load_examples(path: str | Path, k: int | None, split: str | None = None, seed: int = 0) -> Examples:
    """K examples chosen deterministically (all when ``k`` is None or larger than the set).

    A dataset folder gives ``split`` (default: ``train`` for calibration when present, else
    ``test``); a ``.npz`` needs ``inputs`` and may hold ``puzzle_identifiers`` and ``labels``."""
    from hrm_deploy.data.format import load_split, select_examples

    p = Path(path)
    odd = not_a_plain_file(p)
    if odd is not None:
        raise DataError(f"calibration/evaluation data {p} is {odd}; pass a dataset folder or a .npz file")
    if not p.exists():
        raise DataError(f"calibration/evaluation data {p} does not exist; pass a dataset folder or a .npz file")
    if p.is_file():
        if p.suffix != ".npz":
            raise DataError(f"{p} is neither a dataset folder nor a .npz file; pass one of those")
        try:
            with np.load(p) as npz:
                arrays = {name: npz[name] for name in npz.files}
        except (OSError, ValueError) as exc:
            raise DataError(f"{p} is not a readable .npz ({exc}); write it with numpy.savez") from None
        if "inputs" not in arrays or arrays["inputs"].ndim != 2:
            raise DataError(f"{p} needs an 'inputs' array of shape [N, seq_len]; it has {sorted(arrays)}")
        for name in ("inputs", "puzzle_identifiers", "labels"):
            if name in arrays and arrays[name].dtype.kind not in "iu":
                raise DataError(
                    f"{p}: '{name}' holds {arrays[name].dtype} values; token ids, puzzle ids and labels are "
                    "integers: save them as an integer array (e.g. np.int32)"
                )
        inputs = arrays["inputs"]
        pids = arrays.get("puzzle_identifiers", np.zeros(len(inputs), dtype=np.int32))
        labels = arrays.get("labels")
        idx = np.arange(len(inputs))
        if k is not None and k < len(inputs):
            idx = np.sort(np.random.default_rng(seed).choice(len(inputs), size=k, replace=False))
        inputs, pids = inputs[idx], pids[idx]
        labels = labels[idx] if labels is not None else None
    else:
        if split is None:
            split = "train" if (p / "train" / "dataset.json").is_file() else "test"
        data = load_split(p, split)
        idx = select_examples(data, k, seed=seed) if k else np.arange(len(data))
        inputs = _integral(p / split, "inputs", np.asarray(data.inputs[idx]))
        pids = data.example_puzzle_ids()[idx]
        labels = _integral(p / split, "labels", np.asarray(data.labels[idx])).astype(np.int64)
        labels = np.where(labels == data.metadata.ignore_label_id, -100, labels)
    if len(inputs) == 0:
        raise DataError(f"{p} holds no examples")
    inputs, pids = inputs.astype(np.int32), pids.astype(np.int32)
    return Examples(inputs, pids, labels, str(p), _digest(inputs, pids))


def _integral(where: Path, name: str, values: np.ndarray) -> np.ndarray:
    """``values`` unless it is a float array holding a non-integer (2.5 would be read as token 2)."""
    if values.dtype.kind == "f":
        bad = ~np.isfinite(values) | (values != np.round(values))
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise DataError(
                f"{where}: '{name}' holds {values[at]} at {list(at)}; token ids and labels are integers: "
                "save the arrays as integers (e.g. np.int32)"
            )
    return values


def check_vocabulary(examples: Examples, vocab_size: int) -> None:
    """Refuse tokens or labels outside ``0..vocab_size-1`` (labels may be -100, the ignore id) in one
    line naming the first offending row: a model scores such examples as silently wrong."""
    for name, values, ignore in (("input token", examples.inputs, None), ("label", examples.labels, -100)):
        if values is None:
            continue
        bad = (values < 0) | (values >= vocab_size)
        if ignore is not None:
            bad &= values != ignore
        if bad.any():
            row, col = (int(i) for i in np.argwhere(bad)[0])
            raise DataError(
                f"{examples.source}: {name} {int(values[row, col])} at example {row}, position {col} is outside "
                f"the model's vocabulary 0..{vocab_size - 1}; use data encoded for this model"
            )
