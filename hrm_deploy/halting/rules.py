"""Halting rules: which rows stop after an ACT segment (``off``, ``q``, ``threshold:X``,
``budget:P``), parsed from text, resolved against an artifact's model, applied to arrays."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

import numpy as np

from hrm_deploy.errors import ArtifactError, ConfigError
from hrm_deploy.halting.store import stored_budget_threshold


class HaltMode(str, Enum):
    OFF = "off"
    Q = "q"
    THRESHOLD = "threshold"
    BUDGET = "budget"


_RULE_HELP = "use off, q, threshold:X (0 < X < 1) or budget:P (exact-accuracy points, >= 0)"


@dataclass(frozen=True)
class HaltRule:
    """A per-row halting rule. ``threshold`` is X for ``threshold:X`` and the calibrated
    threshold for ``budget:P`` (None until calibrated); ``budget`` is P in points.
    ``q_halt_only``: the ``q`` rule compares q_halt with 0 (the model's continue logit is untrained)."""

    mode: HaltMode
    threshold: float | None = None
    budget: float | None = None
    min_steps: int = 1
    max_steps: int | None = None
    q_halt_only: bool = False

    def __post_init__(self) -> None:
        if self.min_steps < 1 or (self.max_steps is not None and self.max_steps < self.min_steps):
            raise ConfigError(
                f"halting needs 1 <= --min-steps <= --max-steps, got {self.min_steps} and {self.max_steps}"
            )

    @classmethod
    def parse(cls, text: str | None, *, min_steps: int | None = 1, max_steps: int | None = None) -> HaltRule:
        """``off`` | ``q`` | ``threshold:0.7`` | ``budget:1.0`` -> a rule (bad text: one-line ConfigError)."""
        text = (text or "off").strip().lower()
        name, _, arg = text.partition(":")
        try:
            mode = HaltMode(name)
        except ValueError:
            raise ConfigError(f"--halt {text!r}: unknown rule; {_RULE_HELP}") from None
        threshold = budget = None
        if mode in (HaltMode.OFF, HaltMode.Q):
            if arg:
                raise ConfigError(f"--halt {text!r}: {mode.value} takes no value; {_RULE_HELP}")
        else:
            try:
                value = float(arg)
            except ValueError:
                raise ConfigError(f"--halt {text!r}: {mode.value} needs a number after ':'; {_RULE_HELP}") from None
            if mode is HaltMode.THRESHOLD and not 0.0 < value < 1.0 or mode is HaltMode.BUDGET and not value >= 0.0:
                raise ConfigError(f"--halt {text!r}: value out of range; {_RULE_HELP}")
            threshold, budget = (value, None) if mode is HaltMode.THRESHOLD else (None, value)
        return cls(mode, threshold, budget, min_steps or 1, max_steps)

    @property
    def text(self) -> str:
        if self.mode is HaltMode.THRESHOLD:
            return f"threshold:{self.threshold:g}"
        if self.mode is HaltMode.BUDGET:
            return f"budget:{self.budget:g}"
        return self.mode.value

    @property
    def active(self) -> bool:
        """False when the rule always runs every step (``off`` with no max_steps)."""
        return self.mode is not HaltMode.OFF or self.max_steps is not None or self.min_steps > 1

    def with_threshold(self, threshold: float) -> HaltRule:
        return replace(self, threshold=float(threshold))

    def should_halt(
        self, step: int | np.ndarray, q_halt: np.ndarray, q_continue: np.ndarray, total_steps: int | None = None
    ) -> np.ndarray:
        """Which rows stop after ``step`` (1-based; an int or one per row) given this step's
        ``q_halt`` / ``q_continue`` logits [B] -> bool [B]. ``total_steps`` (the model's
        ``halt_max_steps``) makes the last step halt; the driver stops there anyway."""
        q_halt = np.asarray(q_halt, dtype=np.float32)
        step_arr = np.broadcast_to(np.asarray(step), q_halt.shape)
        if self.mode is HaltMode.OFF:
            halt = np.zeros(q_halt.shape, dtype=bool)
        elif self.mode is HaltMode.Q:
            halt = q_halt > (0.0 if self.q_halt_only else np.asarray(q_continue, dtype=np.float32))
        else:
            if self.threshold is None:
                raise ConfigError(
                    f"--halt {self.text}: no calibrated threshold for this artifact; run "
                    f"`hrm-deploy verify ARTIFACT --halt {self.text}` or `hrm-deploy solve ... "
                    f"--halt {self.text}` (they calibrate and store it in the manifest) or use threshold:X"
                )
            # sigmoid(q) > X  <=>  q > logit(X): no overflow for large |q|
            halt = q_halt > _logit(self.threshold)
        halt = halt & (step_arr >= self.min_steps)
        last = (
            min(x for x in (self.max_steps, total_steps) if x is not None)
            if (self.max_steps is not None or total_steps is not None)
            else None
        )
        if last is not None:
            halt = halt | (step_arr >= last)
        return halt


def _logit(p: float) -> float:
    p = min(max(p, 1e-12), 1 - 1e-12)
    return math.log(p / (1 - p))


def resolve_rule(rule: HaltRule | str | None, artifact: str | None = None) -> HaltRule:
    """A rule ready to run: text parsed; ``q`` made the artifact's model's own training rule; for
    ``budget:P`` the threshold read from the artifact's manifest (``halting.budgets``) when it was
    calibrated there."""
    if rule is None or isinstance(rule, str):
        rule = HaltRule.parse(rule)
    if rule.mode is HaltMode.Q and artifact is not None:
        rule = replace(rule, q_halt_only=halts_on_q_halt_alone(artifact))
    if rule.mode is HaltMode.BUDGET and rule.threshold is None and artifact is not None:
        stored = stored_budget_threshold(artifact, rule)
        if stored is not None:
            rule = rule.with_threshold(stored)
    return rule


def halts_on_q_halt_alone(artifact: str | Path) -> bool:
    """Whether the model behind ``artifact`` was trained to halt on ``q_halt > 0`` alone: read
    from the manifest's model config, else from the checkpoint the artifact came from."""
    from hrm_deploy.artifacts import find_reference, is_checkpoint
    from hrm_deploy.manifest import manifest_path, read_manifest
    from hrm_deploy.model.checkpoint import read_checkpoint
    from hrm_deploy.model.families import config_from_dict

    if manifest_path(artifact).is_file():
        model = (read_manifest(artifact).get("config") or {}).get("model")
        if isinstance(model, dict):
            return config_from_dict(model).halts_on_q_halt_alone
    if Path(artifact).suffix == ".onnx":  # our exports record the model config in the graph too
        import onnx

        from hrm_deploy.export.metadata import graph_metadata

        try:
            recorded = graph_metadata(onnx.load(str(artifact), load_external_data=False)).get("config")
        except ArtifactError:  # not one of our exports: its manifest chain is the last source
            recorded = None
        if isinstance(recorded, dict) and recorded:
            return config_from_dict(recorded).halts_on_q_halt_alone
    try:
        checkpoint = Path(artifact) if is_checkpoint(artifact) else find_reference(Path(artifact))
    except ArtifactError:
        raise ConfigError(
            f"--halt q: cannot tell which halting rule {Path(artifact).name}'s model was trained with (no manifest "
            "or recorded config); use threshold:0.5 (q_halt > 0) or give the artifact its manifest"
        ) from None
    return read_checkpoint(checkpoint).config.halts_on_q_halt_alone


# --------------------------------------------------------------------------------- evaluation
def simulate_steps(rule: HaltRule, q_halt: np.ndarray, q_continue: np.ndarray) -> np.ndarray:
    """The step each row halts at under ``rule`` (int32 [N]) from all-step logits [N, T]: what
    :func:`drive` would do, without re-running the model (every step's outputs are known)."""
    n, steps = q_halt.shape
    used = np.full(n, steps, dtype=np.int32)
    pending = np.ones(n, dtype=bool)
    for step in range(1, steps + 1):
        stop = rule.should_halt(step, q_halt[:, step - 1], q_continue[:, step - 1], total_steps=steps) & pending
        used[stop] = step
        pending &= ~stop
    return used
