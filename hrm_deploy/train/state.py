"""Training state that is not weights: random generators and the persistent ACT carry,
as saved in (and restored from) a trainer checkpoint."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from hrm_deploy.contract import CARRY
from hrm_deploy.model.hrm import ACTCarry, Carry
from hrm_deploy.train.distributed import Distributed, gather_rows


def seed_all(seed: int, rank: int = 0) -> None:
    """Seed python, numpy and torch (torch per rank: exploration draws differ per rank)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed + rank)


def rng_state() -> dict[str, Any]:
    """Every generator's state (python, numpy, torch, CUDA) in a torch.save-able dict."""
    np_state: Any = np.random.get_state()  # legacy tuple: ("MT19937", keys, pos, has_gauss, cached)
    return {
        "python": list(random.getstate()[1]),
        "python_pos": random.getstate()[2],
        "numpy": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_pos": int(np_state[2]),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` saved."""
    random.setstate((3, tuple(state["python"]), state["python_pos"]))
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), state["numpy_pos"], 0, 0.0))
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def carry_state(carry: ACTCarry | None, dist_info: Distributed) -> dict[str, Any] | None:
    """The global batch's carry on the CPU (collective under DDP: every rank takes part)."""
    if carry is None:
        return None
    state = {
        **{name: getattr(carry.inner, name) for name in CARRY},
        "steps": carry.steps,
        "halted": carry.halted,
        **{f"data.{k}": v for k, v in carry.current_data.items()},
    }
    return {k: gather_rows(v, dist_info).cpu() for k, v in state.items()}


def carry_from(state: dict[str, Any] | None, device: torch.device, dist_info: Distributed) -> ACTCarry | None:
    """This rank's rows of a saved global-batch carry."""
    if state is None:
        return None
    rows = len(state["steps"]) // dist_info.world
    state = {k: v[dist_info.rank * rows : (dist_info.rank + 1) * rows].to(device) for k, v in state.items()}
    data = {k[5:]: v for k, v in state.items() if k.startswith("data.")}
    return ACTCarry(Carry(*(state[name] for name in CARRY)), state["steps"], state["halted"], data)
