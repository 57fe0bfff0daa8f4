"""TRMConfig: the Tiny Recursive Model family's config class and helpers (key layout, fields its
weights tell, description), the TRM row of :mod:`hrm_deploy.model.families` names them.

No torch import here: the CLI reads configs cheaply.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from hrm_deploy.errors import ConfigError
from hrm_deploy.model.config import HRMConfig, _find_multiple

TRM_POS_ENCODINGS = ("rope", "learned", "none")


@dataclass(frozen=True)
class TRMConfig(HRMConfig):
    """Architecture and ACT settings of a Tiny Recursive Model (upstream
    ``TinyRecursiveReasoningModel_ACTV1``): one ``L_level`` network of ``L_layers`` blocks
    applied ``H_cycles * (L_cycles + 1)`` times per ACT step.

    ``puzzle_emb_len`` is upstream's field: the puzzle-prefix length (upstream: 0 means
    ceil(puzzle_emb_ndim / hidden_size), which is what is stored). ``mlp_t`` swaps attention
    for a SwiGLU across the sequence axis; ``pos_encodings`` may be ``none``.
    ``no_ACT_continue``: training halted on ``q_halt > 0`` and the continue logit is untrained.
    ``H_layers`` is ignored by upstream TRM and kept at 0.
    """

    H_layers: int = 0
    H_cycles: int = 3
    L_cycles: int = 6
    L_layers: int = 2
    puzzle_emb_len: int = 16  # type: ignore[assignment]  # a field here, derived in HRMConfig
    mlp_t: bool = False
    no_ACT_continue: bool = True

    family: ClassVar[str] = "trm"
    pos_choices: ClassVar[tuple[str, ...]] = TRM_POS_ENCODINGS

    def __post_init__(self) -> None:
        self._check_common(())
        if self.H_layers != 0:
            raise ConfigError(f"TRM has no H level: H_layers must be 0 (upstream ignores it), got {self.H_layers}")
        if not isinstance(self.puzzle_emb_len, int) or self.puzzle_emb_len < 0:
            raise ConfigError(f"TRMConfig.puzzle_emb_len must be an integer >= 0, got {self.puzzle_emb_len!r}")
        if self.puzzle_emb_ndim == 0 and self.puzzle_emb_len > 0:
            raise ConfigError(
                f"puzzle_emb_len {self.puzzle_emb_len} without a puzzle embedding (puzzle_emb_ndim 0): upstream's "
                "carry would have prefix positions its input lacks; set puzzle_emb_len 0"
            )
        if self.puzzle_emb_len == 0:  # upstream: 0 means "as many positions as the embedding needs"
            object.__setattr__(self, "puzzle_emb_len", -(self.puzzle_emb_ndim // -self.hidden_size))
        if self.puzzle_emb_len * self.hidden_size < self.puzzle_emb_ndim:
            raise ConfigError(
                f"puzzle_emb_len {self.puzzle_emb_len} x hidden_size {self.hidden_size} cannot hold "
                f"puzzle_emb_ndim {self.puzzle_emb_ndim}; fix arch.puzzle_emb_len"
            )

    @property
    def halts_on_q_halt_alone(self) -> bool:
        return self.no_ACT_continue

    @property
    def mlp_t_intermediate_size(self) -> int:
        """Width of the sequence-axis SwiGLU (``mlp_t``): upstream's rule applied to seq_len + prefix."""
        return _find_multiple(round(self.expansion * self.total_seq_len * 2 / 3), 256)

    @property
    def blocks_per_step(self) -> int:
        """Blocks evaluated in one ACT step: the L_level runs H_cycles * (L_cycles + 1) times."""
        return self.H_cycles * (self.L_cycles + 1) * self.L_layers

    def parameter_count(self) -> int:
        d, inter = self.hidden_size, self.intermediate_size
        t = self.total_seq_len
        mixer = t * 2 * self.mlp_t_intermediate_size + self.mlp_t_intermediate_size * t if self.mlp_t else 4 * d * d
        block = mixer + d * 2 * inter + inter * d
        total = block * self.L_layers + 2 * self.vocab_size * d + 2 * d + 2
        if self.pos_encodings == "learned":
            total += t * d
        return total

    # The family's helpers ------------------------------------------------------------
    @classmethod
    def has_layout(cls, keys: Iterable[str]) -> bool:
        """TRM's weights: an ``L_level`` and no ``H_level``."""
        keys = list(keys)
        return not HRMConfig.has_layout(keys) and any(k.startswith("L_level.") for k in keys)

    @classmethod
    def infer_fields(cls, state: Mapping[str, Any], found: dict[str, Any]) -> None:
        """mlp_t from its weights, whose width is the prefix + token positions."""
        mlp_t = state.get("L_level.layers.0.mlp_t.gate_up_proj.weight")
        found["mlp_t"] = mlp_t is not None
        if mlp_t is not None:
            found["_total_seq_len"] = int(mlp_t.shape[1])
            found["_mlp_t_intermediate_size"] = int(mlp_t.shape[0]) // 2

    @classmethod
    def derive_fields(cls, fields: dict[str, Any], hidden: Mapping[str, Any]) -> None:
        """The puzzle prefix length is the position width less seq_len, unless given."""
        if "_total_seq_len" in hidden and fields.get("puzzle_emb_len") is None:
            fields["puzzle_emb_len"] = hidden["_total_seq_len"] - int(fields["seq_len"])

    def describe(self) -> dict[str, Any]:
        mixer = "mlp-t" if self.mlp_t else "attention"
        return {
            "family": "trm",
            "H_cycles": self.H_cycles,
            "L_cycles": self.L_cycles,
            "L_layers": self.L_layers,
            "mixer": mixer,
            "pos_encodings": self.pos_encodings,
            "puzzle_emb_len": self.puzzle_emb_len,
            "no_ACT_continue": self.no_ACT_continue,
            "blocks_per_step": self.blocks_per_step,
            "recursion": f"T={self.H_cycles} x (n={self.L_cycles} z_L updates + 1 z_H update), one "
            f"{self.L_layers}-layer {mixer} network: {self.H_cycles * (self.L_cycles + 1)} passes per ACT step",
        }
