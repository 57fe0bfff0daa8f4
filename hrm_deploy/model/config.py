"""HRMConfig: the architecture of one HRM, as a typed, versioned, frozen dataclass, and the HRM
family's helpers (key layout, fields its weights tell, description). Every family's config class
derives from it (the checks and sizes every family shares live here); each family keeps its own
class and helpers in its own module (TRM: :mod:`hrm_deploy.model.trm_config`).

Field names follow upstream's ``arch`` section of ``all_config.yaml`` so an upstream
config maps one to one. No torch import here: the CLI reads configs cheaply.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from hrm_deploy.errors import ConfigError

CONFIG_VERSION = 1
POS_ENCODINGS: tuple[str, ...] = ("rope", "learned")
FORWARD_DTYPES = ("float32", "bfloat16", "float16", "float64")


def _find_multiple(a: int, b: int) -> int:
    return (-(a // -b)) * b


@dataclass(frozen=True)
class HRMConfig:
    """Architecture and ACT settings of an HRM (upstream ``HierarchicalReasoningModel_ACTV1``).

    ``seq_len``, ``vocab_size`` and ``num_puzzle_identifiers`` come from the dataset;
    the rest from the ``arch`` section of the training config.
    """

    seq_len: int
    vocab_size: int
    num_puzzle_identifiers: int = 1
    H_cycles: int = 2
    L_cycles: int = 2
    H_layers: int = 4
    L_layers: int = 4
    hidden_size: int = 512
    num_heads: int = 8
    expansion: float = 4.0
    halt_max_steps: int = 16
    halt_exploration_prob: float = 0.1
    pos_encodings: str = "rope"
    puzzle_emb_ndim: int = 0
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    forward_dtype: str = "float32"
    version: int = field(default=CONFIG_VERSION)

    # The model family (see :mod:`hrm_deploy.model.families`); serialised only for non-HRM
    # families so HRM configs and manifests keep their fields.
    family: ClassVar[str] = "hrm"
    pos_choices: ClassVar[tuple[str, ...]] = POS_ENCODINGS

    def __post_init__(self) -> None:
        self._check_common(("H_layers",))

    def _check_common(self, extra_positive: tuple[str, ...]) -> None:
        positive = (
            *extra_positive,
            "seq_len",
            "vocab_size",
            "num_puzzle_identifiers",
            "H_cycles",
            "L_cycles",
            "L_layers",
            "hidden_size",
            "num_heads",
            "halt_max_steps",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"HRMConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; "
                "check arch.num_heads in the training config"
            )
        if self.pos_encodings == "rope" and (self.hidden_size // self.num_heads) % 2:
            raise ConfigError("head dimension (hidden_size / num_heads) must be even for RoPE")
        if self.pos_encodings not in self.pos_choices:
            raise ConfigError(f"pos_encodings {self.pos_encodings!r} is not supported; use one of {self.pos_choices}")
        if self.forward_dtype not in FORWARD_DTYPES:
            raise ConfigError(f"forward_dtype {self.forward_dtype!r} is not supported; use one of {FORWARD_DTYPES}")
        if self.puzzle_emb_ndim < 0:
            raise ConfigError("puzzle_emb_ndim must be >= 0")
        if self.version != CONFIG_VERSION:
            raise ConfigError(
                f"HRMConfig version {self.version} is not understood by this hrm-deploy "
                f"(it reads version {CONFIG_VERSION}); upgrade hrm-deploy"
            )

    # Derived sizes -----------------------------------------------------------------
    @property
    def puzzle_emb_len(self) -> int:
        """Number of prefix tokens holding the puzzle embedding: ceil(ndim / hidden)."""
        return -(self.puzzle_emb_ndim // -self.hidden_size)

    @property
    def total_seq_len(self) -> int:
        """Sequence length inside the model: puzzle prefix + tokens."""
        return self.seq_len + self.puzzle_emb_len

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def intermediate_size(self) -> int:
        """SwiGLU width as upstream sizes it: round(expansion * D * 2/3) up to a multiple of 256."""
        return _find_multiple(round(self.expansion * self.hidden_size * 2 / 3), 256)

    @property
    def blocks_per_step(self) -> int:
        """Transformer blocks evaluated in one ACT step."""
        return self.H_cycles * (self.L_cycles * self.L_layers + self.H_layers)

    def parameter_count(self) -> int:
        """Trainable parameters (the puzzle embedding buffer is not counted, as upstream)."""
        d, inter = self.hidden_size, self.intermediate_size
        block = d * 3 * d + d * d + d * 2 * inter + inter * d
        total = block * (self.H_layers + self.L_layers)
        total += 2 * self.vocab_size * d + 2 * d + 2
        if self.pos_encodings == "learned":
            total += self.total_seq_len * d
        return total

    # (De)serialisation -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.family != HRMConfig.family:
            out["family"] = self.family
        return out

    def replace(self, **changes: Any) -> HRMConfig:
        return dataclasses.replace(self, **changes)

    @property
    def halts_on_q_halt_alone(self) -> bool:
        """True when training halted on ``q_halt > 0`` (the continue logit is untrained)."""
        return False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, strict: bool = False) -> HRMConfig:
        """Build from a mapping; unknown keys (upstream's ``name``, ``loss``...) are ignored
        unless ``strict``. Numbers given as strings or floats are coerced where exact.
        A ``family`` key must name this class's family: a stored config of any family is read by
        :func:`hrm_deploy.model.families.config_from_dict`, which picks the class."""
        family = data.get("family", HRMConfig.family)
        if family != cls.family:
            raise ConfigError(
                f"this config is of model family {family!r}, not {cls.family!r}; read it with "
                "hrm_deploy.model.families.config_from_dict"
            )
        data = {k: v for k, v in data.items() if k != "family"}
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(known))
        if strict and unknown:
            raise ConfigError(f"unknown HRMConfig fields {unknown}")
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            if name not in known or value is None:
                continue
            kind = known[name].type
            try:
                if kind == "int":
                    as_float = float(value)
                    if not math.isfinite(as_float) or as_float != int(as_float):
                        raise ValueError
                    value = int(as_float)
                elif kind == "float":
                    value = float(value)
                elif kind == "bool":
                    if not isinstance(value, bool):
                        raise ValueError

                else:
                    value = str(value)
            except (TypeError, ValueError):
                raise ConfigError(f"config field {name}={value!r} is not a valid {kind}") from None
            kwargs[name] = value
        missing = [n for n in ("seq_len", "vocab_size") if n not in kwargs]
        if missing:
            raise ConfigError(f"config is missing {missing}")
        return cls(**kwargs)

    # The family's helpers (its registry row names this class; see hrm_deploy.model.families) ----
    @classmethod
    def has_layout(cls, keys: Iterable[str]) -> bool:
        """True when a state dict's (prefix-free) keys are this family's: HRM has an ``H_level``."""
        return any(k.startswith("H_level.") for k in keys)

    @classmethod
    def infer_fields(cls, state: Mapping[str, Any], found: dict[str, Any]) -> None:
        """Add to ``found`` the fields only HRM's weights tell: RoPE unless the weights hold learned
        positions (it has no other encoding with no weights); with learned positions, seq_len is
        their width less the puzzle prefix (``found['_total_seq_len']``)."""
        if "_total_seq_len" not in found:
            found["pos_encodings"] = "rope"
        elif "hidden_size" in found:
            found["seq_len"] = found["_total_seq_len"] - (-(found["puzzle_emb_ndim"] // -found["hidden_size"]))

    @classmethod
    def derive_fields(cls, fields: dict[str, Any], hidden: Mapping[str, Any]) -> None:
        """Fill fields that follow from the others (HRM's puzzle prefix follows from puzzle_emb_ndim:
        nothing to derive)."""

    def describe(self) -> dict[str, Any]:
        """The family and its recursion, as ``inspect`` shows them."""
        return {
            "family": "hrm",
            "H_cycles": self.H_cycles,
            "L_cycles": self.L_cycles,
            "H_layers": self.H_layers,
            "L_layers": self.L_layers,
            "mixer": "attention",
            "pos_encodings": self.pos_encodings,
            "blocks_per_step": self.blocks_per_step,
            "recursion": f"{self.H_cycles} H cycles x ({self.L_cycles} L-level passes of {self.L_layers} layers "
            f"+ 1 H-level pass of {self.H_layers} layers) per ACT step",
        }
