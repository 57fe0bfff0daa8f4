"""Early halting at inference: per-row ACT halting rules, a host-side step driver and
continuous batching, over any backend that runs one ACT segment per call.

Upstream evaluation always runs ``halt_max_steps`` segments; halting is therefore never on
by default (``HaltMode.OFF``). A rule decides after each segment which rows stop:

* ``q``: the checkpoint's own training rule: ``q_halt > q_continue`` (HRM), or ``q_halt > 0``
  where training ignored the continue logit (TRM's ``no_ACT_continue``); :func:`resolve_rule`
  reads which from the artifact's model config;
* ``threshold:X``: ``sigmoid(q_halt) > X``;
* ``budget:P``: a threshold calibrated on held-out data so that at most P points of exact
  accuracy are lost (:func:`calibrate_budget`), stored in the artifact's manifest.

``min_steps`` / ``max_steps`` bound every rule; the last step always halts. A halted row keeps
the outputs of its halting step, which are exactly what running it alone to that step gives:
rows never interact inside a segment, and a new row starts from the initial state through the
step graph's per-row ``reset`` input.

Shapes: B rows, S = seq_len, V = vocab, T = steps. Carries are opaque to the driver (a tuple
of batch-first arrays or tensors); a :class:`StepFunction` knows how to make and slice them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hrm_deploy.errors import ArtifactError, ConfigError
from hrm_deploy.metrics import row_scores, solved_rows

HaltFn = Callable[..., np.ndarray]  # (step, q_halt [B], q_continue [B]) -> bool [B]


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
    from hrm_deploy.model.config import HRMConfig

    if manifest_path(artifact).is_file():
        model = (read_manifest(artifact).get("config") or {}).get("model")
        if isinstance(model, dict):
            return HRMConfig.from_dict(model).halts_on_q_halt_alone
    if Path(artifact).suffix == ".onnx":  # our exports record the model config in the graph too
        import onnx

        from hrm_deploy.export.metadata import graph_metadata

        try:
            recorded = graph_metadata(onnx.load(str(artifact), load_external_data=False)).get("config")
        except ArtifactError:  # not one of our exports: its manifest chain is the last source
            recorded = None
        if isinstance(recorded, dict) and recorded:
            return HRMConfig.from_dict(recorded).halts_on_q_halt_alone
    try:
        checkpoint = Path(artifact) if is_checkpoint(artifact) else find_reference(Path(artifact))
    except ArtifactError:
        raise ConfigError(
            f"--halt q: cannot tell which halting rule {Path(artifact).name}'s model was trained with (no manifest "
            "or recorded config); use threshold:0.5 (q_halt > 0) or give the artifact its manifest"
        ) from None
    return read_checkpoint(checkpoint).config.halts_on_q_halt_alone


def _budget_key(rule: HaltRule) -> str:
    return f"{rule.budget:g}|min{rule.min_steps}|max{rule.max_steps or 0}"


def calibration_cache(artifact: str | Path) -> Path:
    """Where calibrations of a file without a writable manifest of ours are kept (a user's or the
    bundled checkpoint, a read-only artifact): the user cache folder, keyed by the file's sha256,
    never the package or the artifact's folder."""
    from hrm_deploy.io import cache_dir, sha256_file

    return cache_dir("halting", f"{sha256_file(artifact)}.json")


def _stored_budgets(artifact: str) -> dict[str, Any]:
    """The budgets calibrated for ``artifact``: its manifest's, then the user cache's."""
    import json

    from hrm_deploy.manifest import manifest_path, read_manifest

    budgets: dict[str, Any] = {}
    if Path(artifact).is_file():
        cached = calibration_cache(artifact)
        if cached.is_file():
            try:
                data = json.loads(cached.read_text())
                budgets.update(data.get("budgets", {}) if isinstance(data, dict) else {})
            except (OSError, ValueError):
                pass  # a damaged cache entry is recomputed, not used
    if manifest_path(artifact).is_file():
        budgets.update(read_manifest(artifact).get("halting", {}).get("budgets", {}))
    return budgets


def stored_budget_threshold(artifact: str, rule: HaltRule) -> float | None:
    entry = _stored_budgets(artifact).get(_budget_key(rule))
    return None if entry is None else float(entry["threshold"])


# --------------------------------------------------------------------------------- the step protocol
class StepFunction(Protocol):
    """One ACT segment per call. ``steps`` is the model's ``halt_max_steps``."""

    steps: int

    def initial_carry(self, batch: int) -> Any: ...

    def take(self, carry: Any, rows: np.ndarray) -> Any:
        """The carry of ``rows`` (int64 indices) only, in that order."""
        ...

    def __call__(
        self, inputs: np.ndarray, puzzle_ids: np.ndarray, carry: Any, reset: np.ndarray
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
        """(inputs int32 [B,S], puzzle_ids int32 [B], carry, reset bool [B]) -> (carry,
        logits float32 [B,S,V], q_halt [B], q_continue [B]); rows with reset start afresh."""
        ...


class OrtStep:
    """The exported single-step graph on an ONNX Runtime session; carry = (z_H, z_L) float32."""

    def __init__(self, session: Any, steps: int):
        self.session, self.steps = session, steps
        dims = next(i.shape for i in session.get_inputs() if i.name == "z_H")
        self._state = (int(dims[1]), int(dims[2]))

    def initial_carry(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        return (np.zeros((batch, *self._state), np.float32), np.zeros((batch, *self._state), np.float32))

    def take(self, carry: Any, rows: np.ndarray) -> Any:
        return tuple(c[rows] for c in carry)

    def __call__(self, inputs, puzzle_ids, carry, reset):
        z_H, z_L, logits, q_halt, q_continue = self.session.run(
            ["z_H_out", "z_L_out", "logits", "q_halt_logits", "q_continue_logits"],
            {
                "inputs": inputs.astype(np.int32),
                "puzzle_identifiers": puzzle_ids.astype(np.int32),
                "z_H": carry[0],
                "z_L": carry[1],
                "reset": reset.astype(bool),
            },
        )
        return (z_H, z_L), logits, q_halt, q_continue


class TorchStep:
    """The PyTorch reference's one segment (``export.unroll.single_step``); the carry stays
    on the module's device as torch tensors, outputs come back as numpy."""

    def __init__(self, model: Any, device: Any = "cpu", steps: int | None = None):
        import torch

        from hrm_deploy.export.unroll import single_step

        self.torch, self.device = torch, torch.device(device)
        self.module = single_step(model).to(self.device)
        core = self.module.step.core
        self.steps = int(steps or core.config.halt_max_steps)
        self._state = (core.config.total_seq_len, core.config.hidden_size)
        self._dtype = next(self.module.parameters()).dtype

    def initial_carry(self, batch: int) -> Any:
        z = self.torch.zeros((batch, *self._state), dtype=self._dtype, device=self.device)
        return (z, z.clone())

    def take(self, carry: Any, rows: np.ndarray) -> Any:
        index = self.torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.device)
        return tuple(c.index_select(0, index) for c in carry)

    def __call__(self, inputs, puzzle_ids, carry, reset):
        torch = self.torch
        with torch.inference_mode():

            def to(a: np.ndarray):
                return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

            z_H, z_L, logits, q_halt, q_continue = self.module(
                to(inputs.astype(np.int32)), to(puzzle_ids.astype(np.int32)), carry[0], carry[1], to(reset.astype(bool))
            )
            return (
                (z_H, z_L),
                logits.float().cpu().numpy(),
                q_halt.float().cpu().numpy(),
                q_continue.float().cpu().numpy(),
            )


# --------------------------------------------------------------------------------- the driver
def _results(n: int, steps: int, seq_len: int, vocab: int) -> dict[str, np.ndarray]:
    return {
        "logits": np.zeros((n, seq_len, vocab), np.float32),
        "q_halt_logits": np.full((n, steps), np.nan, np.float32),
        "q_continue_logits": np.full((n, steps), np.nan, np.float32),
        "step_predictions": np.full((n, steps, seq_len), -1, np.int32),
        "steps_used": np.zeros(n, np.int32),
    }


def _record_step(
    out: dict[str, np.ndarray],
    rows: np.ndarray,
    step: np.ndarray | int,
    logits: np.ndarray,
    q_halt: np.ndarray,
    q_continue: np.ndarray,
    halt: HaltFn | None,
) -> np.ndarray:
    """Store one step's q logits and argmax for ``rows`` (puzzle indices) at ``step`` (1-based,
    one value or one per row); return which of them the rule stops now (bool [len(rows)])."""
    out["q_halt_logits"][rows, step - 1] = q_halt
    out["q_continue_logits"][rows, step - 1] = q_continue
    out["step_predictions"][rows, step - 1] = logits.argmax(-1)
    if halt is None:
        return np.zeros(len(rows), dtype=bool)
    return np.asarray(halt(step, q_halt, q_continue), dtype=bool)


def drive(
    step_fn: StepFunction,
    inputs: np.ndarray,
    puzzle_ids: np.ndarray,
    halt: HaltFn | None = None,
    *,
    compact: bool = True,
) -> dict[str, np.ndarray]:
    """Run one batch segment by segment until every row halted (or ``step_fn.steps``).

    Returns ``logits`` [B,S,V] of each row's halting step, ``steps_used`` int32 [B], and per
    step ``q_halt_logits`` / ``q_continue_logits`` [B,T] and ``step_predictions`` [B,T,S]
    (NaN / -1 after a row's halting step). ``compact`` drops halted rows from later calls
    (less work on a CPU); without it they keep being computed and masked, as on a device."""
    batch = len(inputs)
    steps = step_fn.steps
    carry = step_fn.initial_carry(batch)
    active = np.arange(batch)
    out: dict[str, np.ndarray] | None = None
    reset = np.ones(batch, dtype=bool)
    for step in range(1, steps + 1):
        rows = active if compact else np.arange(batch)
        carry, logits, q_halt, q_continue = step_fn(inputs[rows], puzzle_ids[rows], carry, reset[: len(rows)])
        reset = np.zeros(batch, dtype=bool)
        if out is None:
            out = _results(batch, steps, logits.shape[1], logits.shape[2])
        if not compact:  # the rows still running, as positions in this call
            logits, q_halt, q_continue = logits[active], q_halt[active], q_continue[active]
        stop = _record_step(out, active, step, logits, q_halt, q_continue, halt)
        if step == steps:
            stop = np.ones(len(active), dtype=bool)
        done = active[stop]
        out["logits"][done] = logits[stop]
        out["steps_used"][done] = step
        if stop.all():
            break
        if compact:
            carry = step_fn.take(carry, np.flatnonzero(~stop))
        active = active[~stop]
    assert out is not None
    return out


def run_continuous(
    step_fn: StepFunction, inputs: np.ndarray, puzzle_ids: np.ndarray, batch: int, rule: HaltRule | HaltFn | None
) -> dict[str, np.ndarray]:
    """Continuous batching over a stream: ``batch`` slots; a row that halts is replaced by the
    next puzzle through the step graph's per-row ``reset`` input, so the batch stays full
    until the stream runs dry. Returns :func:`drive`'s outputs for every puzzle, in input order."""
    n = len(inputs)
    if batch < 1:
        raise ConfigError(f"continuous batching needs a batch of at least 1, got {batch}")
    halt = rule.should_halt if isinstance(rule, HaltRule) else rule
    steps = step_fn.steps
    slots = min(batch, n)
    owner = np.arange(slots)  # puzzle index per slot
    step_of = np.ones(slots, dtype=np.int64)  # the step each slot runs next (1-based)
    reset = np.ones(slots, dtype=bool)
    carry = step_fn.initial_carry(slots)
    next_puzzle = slots
    out: dict[str, np.ndarray] | None = None
    while len(owner):
        carry, logits, q_halt, q_continue = step_fn(inputs[owner], puzzle_ids[owner], carry, reset)
        if out is None:
            out = _results(n, steps, logits.shape[1], logits.shape[2])
        stop = _record_step(out, owner, step_of, logits, q_halt, q_continue, halt)
        stop |= step_of >= steps
        done = owner[stop]
        out["logits"][done] = logits[stop]
        out["steps_used"][done] = step_of[stop]
        step_of += 1
        reset = np.zeros(len(owner), dtype=bool)
        # refill freed slots from the stream (reset=True: the step graph starts them afresh)
        freed = np.flatnonzero(stop)
        refill = freed[: max(0, min(len(freed), n - next_puzzle))]
        owner[refill] = np.arange(next_puzzle, next_puzzle + len(refill))
        step_of[refill] = 1
        reset[refill] = True
        next_puzzle += len(refill)
        keep = np.ones(len(owner), dtype=bool)
        keep[freed[len(refill) :]] = False  # the stream is empty: the batch shrinks
        if not keep.all():
            rows = np.flatnonzero(keep)
            carry, owner, step_of, reset = step_fn.take(carry, rows), owner[rows], step_of[rows], reset[rows]
    assert out is not None
    return out


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


def exact_at(step_predictions: np.ndarray, steps_used: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """bool [N]: is each row's answer at its halting step exactly the label (-100 ignored)?"""
    answer = step_predictions[np.arange(len(steps_used)), steps_used - 1]
    return row_scores(answer, labels)[0]


def rule_summary(steps_used: np.ndarray, solved: np.ndarray | None, steps: int) -> dict[str, float]:
    summary = {
        "mean_steps": float(steps_used.mean()),
        "p90_steps": float(np.percentile(steps_used, 90)),
        "max_steps": steps,
    }
    if solved is not None:
        summary["exact_accuracy"] = float(solved.mean())
    return summary


def accuracy_vs_steps(
    q_halt: np.ndarray,
    q_continue: np.ndarray,
    step_predictions: np.ndarray,
    labels: np.ndarray,
    min_steps: int = 1,
    max_steps: int | None = None,
    thresholds: np.ndarray | None = None,
) -> list[dict[str, float]]:
    """The accuracy-vs-mean-steps curve of ``threshold:X`` over a sweep of X (and the ``q``
    rule's point), from one all-steps run: [{threshold, mean_steps, p90_steps, exact_accuracy}]."""
    steps = q_halt.shape[1]
    if thresholds is None:
        thresholds = np.array([0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999])
    curve = []
    for x in thresholds:
        rule = HaltRule(HaltMode.THRESHOLD, float(x), None, min_steps, max_steps)
        used = simulate_steps(rule, q_halt, q_continue)
        curve.append({"threshold": float(x), **rule_summary(used, exact_at(step_predictions, used, labels), steps)})
    return curve


def calibrate_threshold(
    q_halt: np.ndarray,
    q_continue: np.ndarray,
    step_predictions: np.ndarray,
    labels: np.ndarray,
    budget_points: float,
    min_steps: int = 1,
    max_steps: int | None = None,
    max_candidates: int = 400,
) -> dict[str, float]:
    """The ``threshold:X`` with the fewest mean steps whose exact accuracy is at most
    ``budget_points`` below running every step, on these (held-out) examples. Candidates are
    the sigmoid of every observed q_halt (just below each value, so it halts) plus 1.0 (never)."""
    steps = q_halt.shape[1]
    full = exact_at(step_predictions, np.full(len(labels), steps, np.int32), labels).mean()
    finite = q_halt[np.isfinite(q_halt)].astype(np.float64)
    probs = np.unique(1.0 / (1.0 + np.exp(-np.clip(finite, -60, 60))))
    if len(probs) > max_candidates:  # quantiles of the observed values keep the search cheap
        probs = np.unique(np.quantile(probs, np.linspace(0.0, 1.0, max_candidates)))
    # a threshold just below each observed probability halts that row; 1 - 1e-12 never halts
    candidates = np.unique(np.concatenate([np.nextafter(probs, 0.0), [1.0 - 1e-12]]))
    candidates = candidates[(candidates > 0) & (candidates < 1)]
    best: dict[str, float] | None = None
    for x in candidates:
        rule = HaltRule(HaltMode.THRESHOLD, float(x), None, min_steps, max_steps)
        used = simulate_steps(rule, q_halt, q_continue)
        acc = exact_at(step_predictions, used, labels).mean()
        loss = 100.0 * (full - acc)
        if loss <= budget_points + 1e-9 and (best is None or used.mean() < best["mean_steps"]):
            best = {
                "threshold": float(x),
                "mean_steps": float(used.mean()),
                "exact_accuracy": float(acc),
                "full_exact_accuracy": float(full),
                "loss_points": float(loss),
            }
    assert best is not None  # the never-halt candidate loses nothing
    return best


def calibrate_budget(
    artifact: str,
    data: str,
    budget_points: float,
    *,
    samples: int | None = 512,
    split: str = "train",
    min_steps: int = 1,
    max_steps: int | None = None,
    batch: int = 64,
    **runner_options: Any,
) -> dict[str, Any]:
    """Calibrate ``budget:P`` for ``artifact`` on held-out examples of ``data`` (default: the
    dataset's train split, so verify's test split stays unseen) and store the threshold in the
    artifact's manifest under ``halting.budgets``. Returns the stored entry."""
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.io import write_json
    from hrm_deploy.manifest import check_artifact, manifest_path, read_manifest, update_manifest
    from hrm_deploy.runners import open_runner
    from hrm_deploy.runners.infer import infer_all

    judged = (check_artifact(artifact) or {}).get("sha256") if Path(artifact).is_file() else None
    examples = load_examples(data, samples, split=split if (_has_split(data, split)) else "test")
    if examples.labels is None:
        raise ConfigError(f"budget calibration needs labelled examples; {data} has none")
    runner = open_runner(artifact, **runner_options)
    runner.activate()
    try:
        out = infer_all(runner, examples, batch)
    finally:
        runner.close()
    if "q_continue_logits" not in out or "step_predictions" not in out:
        raise ConfigError(
            f"{artifact} does not expose per-step outputs; budget calibration needs a step graph, "
            "an unrolled graph exported with --step-predictions, an engine or a checkpoint"
        )
    rule = HaltRule(HaltMode.BUDGET, None, budget_points, min_steps, max_steps)
    entry = {
        **calibrate_threshold(
            out["q_halt_logits"],
            out["q_continue_logits"],
            out["step_predictions"],
            examples.labels,
            budget_points,
            min_steps,
            max_steps,
        ),
        "budget_points": budget_points,
        "min_steps": min_steps,
        "max_steps": max_steps,
        "data": examples.source,
        "split": split,
        "examples": len(examples),
    }
    path = manifest_path(artifact)
    if path.is_file() and os.access(path, os.W_OK) and os.access(path.parent, os.W_OK):
        # our artifact: the threshold travels with it, only if the manifest still describes the
        # bytes we calibrated
        halting = dict(read_manifest(artifact).get("halting", {}))
        halting["budgets"] = {**halting.get("budgets", {}), _budget_key(rule): entry}
        update_manifest(artifact, expect_sha256=judged, halting=halting)
        return entry
    # a checkpoint, the bundled model or a read-only artifact: the user cache, keyed by sha256
    cached = calibration_cache(artifact)
    budgets = {**_stored_budgets(artifact), _budget_key(rule): entry}
    try:
        write_json(cached, {"artifact": str(artifact), "budgets": budgets})
    except OSError as exc:
        raise ConfigError(
            f"cannot store the calibrated threshold in {cached} ({exc.strerror}); set HRM_DEPLOY_CACHE "
            "to a writable folder"
        ) from None
    return entry


def _has_split(data: str, split: str) -> bool:
    from pathlib import Path

    return (Path(data) / split / "dataset.json").is_file()


# --------------------------------------------------------------------------------- verify / bench
def _run_all(runner: Any, examples: Any, batch: int, halt: HaltFn | None) -> dict[str, np.ndarray]:
    kwargs = {"halt": halt} if halt is not None else {}
    parts = [runner.infer(examples.feeds(s, s + batch), **kwargs) for s in range(0, len(examples), batch)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def evaluate_halting(
    runner: Any,
    examples: Any,
    rules: list[HaltRule],
    batch: int = 64,
    full: dict[str, np.ndarray] | None = None,
    min_steps: int = 1,
    max_steps: int | None = None,
) -> dict[str, Any]:
    """Per rule: exact accuracy, mean/p90 steps and puzzles/s of an early-exit run on an
    activated runner (rules it cannot run early, e.g. on an unrolled graph, are simulated from
    the per-step outputs and marked so), plus the accuracy-vs-mean-steps curve of ``threshold:X``.
    ``full``: the runner's all-step outputs when already computed."""
    import time

    labels = examples.labels
    if labels is None:
        raise ConfigError("halting accuracy needs labelled examples (a dataset folder or a .npz with labels)")
    full = full if full is not None else _run_all(runner, examples, batch, None)
    steps = int(full["q_halt_logits"].shape[1])
    q_halt = full["q_halt_logits"]
    q_cont = full.get("q_continue_logits")
    per_step = full.get("step_predictions")
    all_steps = np.full(len(examples), steps, np.int32)
    report: dict[str, Any] = {
        "steps": steps,
        "examples": len(examples),
        "all_steps": rule_summary(all_steps, solved_rows(full["logits"], labels), steps),
        "rules": {},
    }
    for rule in rules:
        entry: dict[str, Any]
        simulated = None
        if per_step is not None and (q_cont is not None or rule.mode is not HaltMode.Q):
            simulated = simulate_steps(rule, q_halt, q_cont if q_cont is not None else np.zeros_like(q_halt))
        try:
            start = time.perf_counter()
            out = _run_all(runner, examples, batch, rule.should_halt)
            seconds = time.perf_counter() - start
            entry = {
                **rule_summary(out["steps_used"], solved_rows(out["logits"], labels), steps),
                "run": "early exit",
                "puzzles_per_s": len(examples) / seconds,
            }
            if simulated is not None:
                entry["agrees_with_simulation"] = float((simulated == out["steps_used"]).mean())
        except ConfigError:
            if simulated is None or per_step is None:
                entry = {"run": "not available: this artifact exposes no per-step outputs"}
            else:
                entry = {
                    **rule_summary(simulated, exact_at(per_step, simulated, labels), steps),
                    "run": "simulated from every step's outputs (this artifact always computes all steps)",
                }
        if rule.mode is HaltMode.BUDGET:
            entry["threshold"] = rule.threshold
        report["rules"][rule.text] = entry
    if per_step is not None:
        report["curve"] = accuracy_vs_steps(
            q_halt, q_cont if q_cont is not None else np.zeros_like(q_halt), per_step, labels, min_steps, max_steps
        )
    return report


def halting_markdown(report: dict[str, Any]) -> str:
    lines = ["| halting rule | exact accuracy | mean steps | p90 steps | run |", "|---|---|---|---|---|"]
    rows = [("off (all steps)", {**report["all_steps"], "run": "all steps"})] + list(report["rules"].items())
    for name, entry in rows:
        if "mean_steps" not in entry:
            lines.append(f"| {name} | - | - | - | {entry['run']} |")
            continue
        speed = f", {entry['puzzles_per_s']:.1f} puzzles/s" if "puzzles_per_s" in entry else ""
        lines.append(
            f"| {name} | {entry.get('exact_accuracy', float('nan')):.2%} | {entry['mean_steps']:.2f} | "
            f"{entry['p90_steps']:.0f} of {report['steps']} | {entry['run']}{speed} |"
        )
    return "\n".join(lines) + "\n"


def plot_curve(report: dict[str, Any], path: Any, title: str = "") -> Any:
    """accuracy-vs-mean-steps PNG (None without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    curve = report.get("curve") or []
    if curve:
        ax.plot(
            [c["mean_steps"] for c in curve],
            [100 * c["exact_accuracy"] for c in curve],
            marker=".",
            label="threshold:X sweep",
        )
    for name, entry in [("all steps", report["all_steps"]), *report["rules"].items()]:
        if "mean_steps" in entry and "exact_accuracy" in entry:
            ax.scatter([entry["mean_steps"]], [100 * entry["exact_accuracy"]], zorder=3)
            ax.annotate(name, (entry["mean_steps"], 100 * entry["exact_accuracy"]), fontsize=8)
    ax.set_xlabel("mean ACT steps")
    ax.set_ylabel("exact accuracy (%)")
    ax.set_title(title or "accuracy vs mean ACT steps")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def prepare_rules(
    texts: list[str],
    artifact: str,
    data: str | None,
    *,
    min_steps: int = 1,
    max_steps: int | None = None,
    calib_data: str | None = None,
    flag: str = "--data",
    **runner_options: Any,
) -> list[HaltRule]:
    """Parse ``--halt`` texts; ``budget:P`` takes the threshold stored in the artifact's manifest,
    else calibrates it now, on fresh puzzles of the checkpoint's dataset spec when it stores one
    (never trained on), else on ``data``'s train split (held out from the test split verify and
    bench report on). ``calib_data``, when given, is used instead of both."""
    import sys
    from pathlib import Path

    from hrm_deploy.provenance import heldout_data

    rules = []
    for text in texts:
        rule = resolve_rule(HaltRule.parse(text, min_steps=min_steps, max_steps=max_steps), artifact)
        if rule.mode is HaltMode.BUDGET and rule.threshold is None:
            fresh = heldout_data(artifact) if calib_data is None else None
            source = calib_data or (str(fresh.path) if fresh is not None else data)
            if source is None:
                raise ConfigError(
                    f"--halt {rule.text} needs calibration data and {Path(artifact).name} records no "
                    f"dataset spec: pass {flag} DATASET_DIR"
                )
            print(
                f"calibrating --halt {rule.text} on " + (fresh.message if fresh else f"{source}'s train split"),
                file=sys.stderr,
                flush=True,
            )
            entry = calibrate_budget(
                artifact, source, float(rule.budget or 0.0), min_steps=min_steps, max_steps=max_steps, **runner_options
            )
            rule = rule.with_threshold(entry["threshold"])
        rules.append(rule)
    return rules
