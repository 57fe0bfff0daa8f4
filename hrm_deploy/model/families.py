"""Model families: one registry row per architecture this toolkit loads (HRM, TRM).

Every family implements the same one-segment core interface (``HRMCore``'s):
``input_embeddings`` + ``initial_state`` (embed and initial carry), ``recur`` (the cycles of one
ACT segment), ``heads`` (logits, q_halt, q_continue), so export, parity, runners, halting and
training work on any family without naming it. A row says how to recognise a checkpoint of the
family (upstream's ``arch.name`` and the state-dict key layout), its config class and model
classes, what upstream writes into ``all_config.yaml`` and how to describe its recursion.

No torch import at module level: the CLI reads configs cheaply.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from hrm_deploy.errors import CheckpointError, ConfigError
from hrm_deploy.model.config import HRMConfig, TRMConfig


@dataclass(frozen=True)
class ModelFamily:
    """One registry row.

    ``arch_names``: upstream ``arch.name`` values (``module@Class``) of the family, the first is
    written by ``--export-upstream``. ``has_layout``: True when a state dict's (prefix-free) keys
    are this family's. ``act_path``: ``module:Class`` of the ACT wrapper (imported lazily: torch).
    ``upstream_arch_fields``: the config fields upstream's ``all_config.yaml`` arch section holds.
    ``required_fields``: arch fields the weights cannot tell, never defaulted when loading.
    ``default_mode``: the export/engine mode used when none is asked for (``step`` where the
    unroll would repeat a deep recursion ``halt_max_steps`` times in one graph).

    What the checkpoint loader (:mod:`hrm_deploy.model.checkpoint`) asks of a family, which it
    never names: ``infer_fields(state, found)`` adds the config fields only this family's weights
    tell to ``found`` (the shared sizes are already there; ``_``-prefixed keys are widths the loader
    checks but does not store, e.g. ``_total_seq_len``: prefix + tokens); ``derive_fields(fields,
    hidden)`` fills fields that follow from the others and those widths; ``data_key`` is the key
    of ``all_config.yaml`` naming its datasets (for messages).
    """

    name: str
    title: str
    arch_names: tuple[str, ...]
    config_class: type[HRMConfig]
    has_layout: Callable[[Iterable[str]], bool]
    act_path: str
    upstream_arch_fields: tuple[str, ...]
    required_fields: tuple[str, ...]
    describe: Callable[[Any], dict[str, Any]]
    default_mode: str
    infer_fields: Callable[[dict[str, Any], dict[str, Any]], None]
    derive_fields: Callable[[dict[str, Any], dict[str, Any]], None]
    data_key: str

    def act_class(self) -> Any:
        module, _, cls = self.act_path.partition(":")
        return getattr(importlib.import_module(module), cls)


def _hrm_layout(keys: Iterable[str]) -> bool:
    return any(k.startswith("H_level.") for k in keys)


def _trm_layout(keys: Iterable[str]) -> bool:
    keys = list(keys)
    return not _hrm_layout(keys) and any(k.startswith("L_level.") for k in keys)


def _hrm_infer(state: dict[str, Any], found: dict[str, Any]) -> None:
    """HRM: RoPE unless the weights hold learned positions (it has no other encoding with no
    weights); with learned positions, seq_len is their width less the puzzle prefix."""
    if "_total_seq_len" not in found:
        found["pos_encodings"] = "rope"
    elif "hidden_size" in found:
        found["seq_len"] = found["_total_seq_len"] - (-(found["puzzle_emb_ndim"] // -found["hidden_size"]))


def _hrm_derive(fields: dict[str, Any], hidden: dict[str, Any]) -> None:
    """HRM's puzzle prefix follows from puzzle_emb_ndim (nothing to derive here)."""


def _trm_infer(state: dict[str, Any], found: dict[str, Any]) -> None:
    """TRM: mlp_t from its weights, whose width is the prefix + token positions."""
    mlp_t = state.get("L_level.layers.0.mlp_t.gate_up_proj.weight")
    found["mlp_t"] = mlp_t is not None
    if mlp_t is not None:
        found["_total_seq_len"] = int(mlp_t.shape[1])
        found["_mlp_t_intermediate_size"] = int(mlp_t.shape[0]) // 2


def _trm_derive(fields: dict[str, Any], hidden: dict[str, Any]) -> None:
    """TRM: the puzzle prefix length is the position width less seq_len, unless given."""
    if "_total_seq_len" in hidden and fields.get("puzzle_emb_len") is None:
        fields["puzzle_emb_len"] = hidden["_total_seq_len"] - int(fields["seq_len"])


def _hrm_describe(cfg: HRMConfig) -> dict[str, Any]:
    return {
        "family": "hrm",
        "H_cycles": cfg.H_cycles,
        "L_cycles": cfg.L_cycles,
        "H_layers": cfg.H_layers,
        "L_layers": cfg.L_layers,
        "mixer": "attention",
        "pos_encodings": cfg.pos_encodings,
        "blocks_per_step": cfg.blocks_per_step,
        "recursion": f"{cfg.H_cycles} H cycles x ({cfg.L_cycles} L-level passes of {cfg.L_layers} layers "
        f"+ 1 H-level pass of {cfg.H_layers} layers) per ACT step",
    }


def _trm_describe(cfg: TRMConfig) -> dict[str, Any]:
    mixer = "mlp-t" if cfg.mlp_t else "attention"
    return {
        "family": "trm",
        "H_cycles": cfg.H_cycles,
        "L_cycles": cfg.L_cycles,
        "L_layers": cfg.L_layers,
        "mixer": mixer,
        "pos_encodings": cfg.pos_encodings,
        "puzzle_emb_len": cfg.puzzle_emb_len,
        "no_ACT_continue": cfg.no_ACT_continue,
        "blocks_per_step": cfg.blocks_per_step,
        "recursion": f"T={cfg.H_cycles} x (n={cfg.L_cycles} z_L updates + 1 z_H update), one {cfg.L_layers}-layer "
        f"{mixer} network: {cfg.H_cycles * (cfg.L_cycles + 1)} passes per ACT step",
    }


_COMMON_ARCH = ("halt_exploration_prob", "halt_max_steps", "H_cycles", "L_cycles", "H_layers", "L_layers")
# architecture fields the weights cannot tell: an upstream config must name them
_REQUIRED = ("num_heads", "H_cycles", "L_cycles", "halt_max_steps")
_SIZES = ("hidden_size", "num_heads", "expansion", "puzzle_emb_ndim", "pos_encodings", "rope_theta", "rms_norm_eps")

FAMILIES: dict[str, ModelFamily] = {
    "hrm": ModelFamily(
        name="hrm",
        title="Hierarchical Reasoning Model",
        arch_names=("hrm.hrm_act_v1@HierarchicalReasoningModel_ACTV1",),
        config_class=HRMConfig,
        has_layout=_hrm_layout,
        act_path="hrm_deploy.model.hrm:HRMACT",
        upstream_arch_fields=_COMMON_ARCH + _SIZES,
        required_fields=_REQUIRED,
        describe=_hrm_describe,
        default_mode="unrolled",
        infer_fields=_hrm_infer,
        derive_fields=_hrm_derive,
        data_key="data_path",
    ),
    "trm": ModelFamily(
        name="trm",
        title="Tiny Recursive Model",
        arch_names=("recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1",),
        config_class=TRMConfig,
        has_layout=_trm_layout,
        act_path="hrm_deploy.model.trm:TRMACT",
        upstream_arch_fields=_COMMON_ARCH + _SIZES + ("mlp_t", "puzzle_emb_len", "no_ACT_continue", "forward_dtype"),
        required_fields=_REQUIRED
        + (
            "pos_encodings",
            "puzzle_emb_len",
            "no_ACT_continue",
        ),
        describe=_trm_describe,
        # T*(n+1) passes of the network per ACT step (21 at upstream's 3 x 6): an unroll of 16 steps
        # inlines 336 network passes, so one segment with the carry in and out is the default.
        default_mode="step",
        infer_fields=_trm_infer,
        derive_fields=_trm_derive,
        data_key="data_paths",
    ),
}


def family_named(name: str) -> ModelFamily:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ConfigError(f"model family {name!r} is unknown; this hrm-deploy knows {sorted(FAMILIES)}") from None


def family_of(config: HRMConfig) -> ModelFamily:
    """The registry row of a config object."""
    return family_named(config.family)


def family_for_arch_name(arch_name: str) -> ModelFamily | None:
    """The family whose upstream ``arch.name`` this is (None when no family claims it)."""
    for family in FAMILIES.values():
        if arch_name in family.arch_names:
            return family
    return None


def detect_family(keys: Iterable[str], arch_name: str | None, source: str) -> ModelFamily:
    """The family of an upstream checkpoint from its key layout, checked against ``arch.name``
    in its all_config.yaml when there is one. A disagreement is one clear error."""
    keys = list(keys)
    by_layout = [f for f in FAMILIES.values() if f.has_layout(keys)]
    if not by_layout:
        sample = sorted(keys)[:3]
        raise CheckpointError(
            f"{source}: state-dict keys {sample} match no known model family ({', '.join(FAMILIES)}): "
            "neither H_level.* (HRM) nor L_level.* (TRM) weights"
        )
    named = family_for_arch_name(arch_name) if arch_name else None
    # several layouts can match (a family built on another's networks): arch.name decides then
    family = named if named in by_layout else by_layout[0]
    if arch_name:
        if named is None and family.name != "hrm":
            raise CheckpointError(
                f"{source}: all_config.yaml names arch {arch_name!r}, which no family claims; "
                f"its weights are laid out as {family.title} ({family.arch_names[0]})"
            )
        if named is not None and named is not family:
            raise CheckpointError(
                f"{source}: all_config.yaml names arch {arch_name!r} ({named.title}) but the weights are laid out "
                f"as {family.title}; the config belongs to another run: copy the right all_config.yaml"
            )
    return family


def config_from_dict(data: dict[str, Any], *, strict: bool = False) -> HRMConfig:
    """A stored config (a manifest's, a graph's, a checkpoint's) as its family's config class: the
    ``family`` key names the family (HRM when absent)."""
    family = family_named(str(data.get("family", HRMConfig.family)))
    return family.config_class.from_dict(data, strict=strict)


def describe(config: HRMConfig) -> dict[str, Any]:
    """The family and its recursion, as ``inspect`` shows them."""
    return family_of(config).describe(config)
