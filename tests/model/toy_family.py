"""A toy model family written from scratch for the family seam's tests: its own config class (its
helpers with it), its own network and key layout, and one registry row of plain data. Not a copy
of TRM or HRM: one ``toy_level`` stack of MLP blocks (no token mixing), ``H_cycles`` passes per
ACT step of ``z_L = toy_level(z_L + z_H + x)``, ``z_H = rms_norm(z_H + z_L)``.

Shapes: B batch, T = prefix + seq_len, D = hidden_size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.families import ModelFamily


@dataclass(frozen=True)
class ToyConfig(HRMConfig):
    """HRM's shared fields; no H level (``H_layers`` 0), no token mixing, no positions."""

    H_layers: int = 0
    H_cycles: int = 2
    L_cycles: int = 1
    L_layers: int = 2

    family: ClassVar[str] = "toy"

    def __post_init__(self) -> None:
        self._check_common(())

    @classmethod
    def has_layout(cls, keys: Iterable[str]) -> bool:
        return any(k.startswith("toy_level.") for k in keys)

    @classmethod
    def infer_fields(cls, state: Mapping[str, Any], found: dict[str, Any]) -> None:
        found["L_layers"] = sum(1 for k in state if k.startswith("toy_level.") and k.endswith(".down_proj.weight"))
        gate_up = state.get("toy_level.0.mlp.gate_up_proj.weight")
        if gate_up is not None:
            found["_intermediate_size"] = int(gate_up.shape[0]) // 2

    def describe(self) -> dict[str, Any]:
        return {"family": "toy", "blocks_per_step": self.blocks_per_step, "recursion": f"{self.H_cycles} MLP passes"}

    @property
    def blocks_per_step(self) -> int:
        return self.H_cycles * self.L_layers


ROW = ModelFamily(
    name="toy",
    title="Toy Recursive MLP",
    arch_names=("toy.mlp@ToyACT",),
    config_path="tests.model.toy_family:ToyConfig",
    act_path="tests.model.toy_family_net:ToyACT",
    upstream_arch_fields=("H_cycles", "L_layers", "hidden_size", "num_heads", "expansion", "halt_max_steps"),
    required_fields=("H_cycles", "halt_max_steps"),
    default_mode="step",
    data_key="toy_data",
)
