"""Checks that keep a loaded model from being silently different from the trained one.

- :func:`check_finite`: a NaN or Inf in the weights is refused at load, naming the tensor (such
  weights would pass export, parity and verify, reference and candidate being equally wrong).
- :func:`reconcile_overrides`: a command-line override (``--num-heads 8``) may fill a field a
  checkpoint's stored config lacks, and is then recorded (manifests show it); it may never
  contradict the stored config, and an architecture field the weights cannot tell is never
  defaulted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hrm_deploy.errors import CheckpointError

# Fields the weights cannot tell (their shapes do not depend on them): a wrong or defaulted
# value gives a model that exports and passes parity, then solves nothing.
NOT_IN_WEIGHTS = ("num_heads", "H_cycles", "L_cycles", "halt_max_steps")
# Overrides that are about how the model is run, not which model it is.
RUNTIME_FIELDS = ("forward_dtype", "data_path")


def _flag(key: str) -> str:
    return {"num_puzzle_identifiers": "--num-puzzle-ids"}.get(key, "--" + key.replace("_", "-").lower())


def _same(a: Any, b: Any) -> bool:
    """Equal as config values: ``4`` and ``4.0`` (YAML vs a flag) are the same."""
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def check_finite(state_dict: Mapping[str, Any], source: str | Path = "the checkpoint") -> None:
    """Raise :class:`CheckpointError` naming the first tensor holding NaN or Inf (floating tensors only)."""
    import torch

    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            continue
        finite = torch.isfinite(tensor)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            kind = "NaN" if bool(torch.isnan(tensor).any()) else "Inf"
            raise CheckpointError(
                f"{source}: tensor {name} holds {bad} non-finite value(s) ({kind}); the checkpoint is "
                "damaged or training diverged: use an earlier checkpoint"
            )


def reconcile_overrides(
    stored: Mapping[str, Any],
    overrides: Mapping[str, Any],
    source: str | Path = "the checkpoint",
    required: Iterable[str] = NOT_IN_WEIGHTS,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(config fields, recorded overrides)`` of a stored config and command-line overrides.

    An override equal to the stored value is a no-op; one that differs is refused (the
    checkpoint says what model it is); one for a field the stored config lacks fills it and is
    returned in ``recorded`` (to be written in the manifest). A ``required`` field neither gives
    is refused, never defaulted. ``forward_dtype``/``data_path`` are run options, passed through."""
    fields = dict(stored)
    recorded: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None or key == "data_path":
            continue
        if key in RUNTIME_FIELDS:
            fields[key] = value
            continue
        if key in stored and stored[key] is not None:
            if not _same(stored[key], value):
                raise CheckpointError(
                    f"{source}: {_flag(key)} {value} contradicts the checkpoint's own config ({key}={stored[key]}); "
                    f"leave {_flag(key)} out (an override never changes a stored field: that would be another model)"
                )
            continue
        fields[key] = value
        recorded[key] = value
    absent = [k for k in required if fields.get(k) is None]
    if absent:
        flags = " ".join(f"{_flag(k)} N" for k in absent)
        raise CheckpointError(
            f"{source}: its stored config lacks {', '.join(absent)}, which the weights cannot tell; pass "
            f"{flags} with the values it was trained with (never guessed: a wrong value is a different model)"
        )
    return fields, recorded
