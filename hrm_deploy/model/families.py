"""Model families: one registry row per architecture this toolkit loads (HRM, TRM).

Every family implements the same one-segment core interface (``HRMCore``'s):
``input_embeddings`` + ``initial_state`` (embed and initial carry), ``recur`` (the cycles of one
ACT segment), ``heads`` (logits, q_halt, q_continue), so export, parity, runners, halting and
training work on any family without naming it. A row says how to recognise a checkpoint of the
family (upstream's ``arch.name``), where its config class (with the family's helpers: key
layout, fields its weights tell, description) and model classes live, and what upstream writes
into ``all_config.yaml``. A row is plain data; the behaviour lives in the family's own module.

No torch import at module level: the CLI reads configs cheaply.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from hrm_deploy.errors import CheckpointError, ConfigError
from hrm_deploy.model.config import HRMConfig


@dataclass(frozen=True)
class ModelFamily:
    """One registry row: plain data (names, field lists, ``module:Class`` paths imported lazily).

    ``arch_names``: upstream ``arch.name`` values (``module@Class``) of the family, the first is
    written by ``--export-upstream``. ``config_path``: ``module:Class`` of its config class (a
    :class:`~hrm_deploy.model.config.HRMConfig` subclass holding the family's helpers, in the
    family's own module; no torch). ``act_path``: ``module:Class`` of the ACT wrapper (torch).
    ``upstream_arch_fields``: the config fields upstream's ``all_config.yaml`` arch section holds.
    ``required_fields``: arch fields the weights cannot tell, never defaulted when loading.
    ``default_mode``: the export/engine mode used when none is asked for (``step`` where the
    unroll would repeat a deep recursion ``halt_max_steps`` times in one graph).
    ``data_key``: the key of ``all_config.yaml`` naming its datasets; ``data_list``: upstream
    writes a list there (and an empty ``<data_key>_test``), else one path.

    What the checkpoint loader (:mod:`hrm_deploy.model.checkpoint`) asks of a family, which it
    never names, is the config class's: ``has_layout(keys)``, ``infer_fields(state, found)`` (the
    fields only this family's weights tell; ``_``-prefixed keys are widths the loader checks but
    does not store, e.g. ``_total_seq_len``: prefix + tokens), ``derive_fields(fields, hidden)``
    (fields that follow from the others and those widths) and ``describe()``.
    """

    name: str
    title: str
    arch_names: tuple[str, ...]
    config_path: str
    act_path: str
    upstream_arch_fields: tuple[str, ...]
    required_fields: tuple[str, ...]
    default_mode: str
    data_key: str
    data_list: bool = False

    @property
    def config_class(self) -> type[HRMConfig]:
        """The family's config class (its module imported on first use)."""
        cls: type[HRMConfig] = _load(self.config_path)
        return cls

    def act_class(self) -> Any:
        return _load(self.act_path)

    def has_layout(self, keys: Iterable[str]) -> bool:
        return self.config_class.has_layout(keys)

    def infer_fields(self, state: dict[str, Any], found: dict[str, Any]) -> None:
        self.config_class.infer_fields(state, found)

    def derive_fields(self, fields: dict[str, Any], hidden: dict[str, Any]) -> None:
        self.config_class.derive_fields(fields, hidden)

    def describe(self, config: HRMConfig) -> dict[str, Any]:
        """The family and its recursion of ``config``, as ``inspect`` and export manifests show them."""
        return config.describe()

    def upstream_data(self, data_path: str) -> dict[str, Any]:
        """What upstream's ``all_config.yaml`` says of the dataset ``data_path``, under ``data_key``."""
        if self.data_list:
            return {self.data_key: [data_path], f"{self.data_key}_test": []}
        return {self.data_key: data_path}


def _load(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


_COMMON_ARCH = ("halt_exploration_prob", "halt_max_steps", "H_cycles", "L_cycles", "H_layers", "L_layers")
# architecture fields the weights cannot tell: an upstream config must name them
_REQUIRED = ("num_heads", "H_cycles", "L_cycles", "halt_max_steps")
_SIZES = ("hidden_size", "num_heads", "expansion", "puzzle_emb_ndim", "pos_encodings", "rope_theta", "rms_norm_eps")

FAMILIES: dict[str, ModelFamily] = {
    "hrm": ModelFamily(
        name="hrm",
        title="Hierarchical Reasoning Model",
        arch_names=("hrm.hrm_act_v1@HierarchicalReasoningModel_ACTV1",),
        config_path="hrm_deploy.model.config:HRMConfig",
        act_path="hrm_deploy.model.hrm:HRMACT",
        upstream_arch_fields=_COMMON_ARCH + _SIZES,
        required_fields=_REQUIRED,
        default_mode="unrolled",
        data_key="data_path",
    ),
    "trm": ModelFamily(
        name="trm",
        title="Tiny Recursive Model",
        arch_names=("recursive_reasoning.trm@TinyRecursiveReasoningModel_ACTV1",),
        config_path="hrm_deploy.model.trm_config:TRMConfig",
        act_path="hrm_deploy.model.trm:TRMACT",
        upstream_arch_fields=_COMMON_ARCH + _SIZES + ("mlp_t", "puzzle_emb_len", "no_ACT_continue", "forward_dtype"),
        required_fields=_REQUIRED + ("pos_encodings", "puzzle_emb_len", "no_ACT_continue"),
        # T*(n+1) passes of the network per ACT step (21 at upstream's 3 x 6): an unroll of 16 steps
        # inlines 336 network passes, so one segment with the carry in and out is the default.
        default_mode="step",
        data_key="data_paths",
        data_list=True,
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
    return config.describe()
