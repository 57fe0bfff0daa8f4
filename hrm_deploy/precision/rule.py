"""The accuracy rule every quantized build answers to (the precision stage's INT8/FP8/NVFP4 graphs,
the cpu target's static INT8, loop graphs), measured on held-out puzzles against the FP32 graph.

A candidate passes when every check holds (:meth:`Rule.checks`):

* no non-finite value among the outputs the graph's contract defines (a NaN is a defect, never noise);
* at most ``budget`` points of exact accuracy lost (default 1), judged on *paired* flips: ``lost`` =
  puzzles FP32 solves and the candidate does not, ``gained`` = the reverse; points lost = 100
  (lost - gained) / puzzles;
* what ``verify`` asks of an artifact of this precision (:func:`verify_view`, the thresholds of its
  ``PRECISIONS`` row): argmax agreement over all cells, q_halt sign agreement and, for a graph that
  halts inside (a loop graph with a halting rule), the rows halting at FP32's step; and verify's
  cell judgement (:func:`cell_checks`, by :mod:`hrm_deploy.agreement`'s own measure, flip bounds and
  band, row by row): no answer flipped where FP32 was sure, no cell beyond the band, no agreeing
  cell beyond closeness, the same of q_halt. A build whose graph ``verify`` would refuse is not
  published.

Each check carries a one-sided :data:`CONFIDENCE_PCT` % margin from the counts it was measured on
(one more discordant puzzle or cell than seen, so a clean small sample is not certainty). A verdict
is *settled* when some check fails by more than its margin, or every check passes by more than its
margin; otherwise more puzzles are measured (:meth:`Holdout.decide`), up to a cap where the
measured values decide and the record says so.

The puzzles it is measured on, and how many a verdict needs, are :mod:`hrm_deploy.precision.holdout`'s.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from hrm_deploy.precision.registry import PRECISIONS, Thresholds

log = logging.getLogger(__name__)

DEFAULT_BUDGET_POINTS = 1.0  # exact-accuracy points a quantized graph may lose on the holdout
CONFIDENCE_PCT = 95.0
Z = 1.645  # one-sided 95 % normal quantile


# ----------------------------------------------------------------------------------------------- outputs
@dataclass(frozen=True)
class Outputs:
    """A graph's answers on N puzzles, in the form the rule reads them.

    ``logits`` [N, S, V] float32; ``q_halt`` [N]: the last step's q_halt logit (``verify``'s reading:
    the last column of an unrolled or loop graph's [N, steps], NaN where a loop graph's row halted
    earlier); ``steps`` [N] int32: the ACT steps each row ran, for a graph that reports them (a loop
    graph), else None; ``nonfinite`` [N]: per row, the non-finite values among the outputs the
    contract defines (a loop graph's q logits after a row's halting step are NaN by contract);
    ``q_steps`` [N, T]: q_halt at every step (what verify's cell judgement reads), None: ``q_halt``
    as the one step."""

    logits: np.ndarray
    q_halt: np.ndarray
    steps: np.ndarray | None
    nonfinite: np.ndarray
    q_steps: np.ndarray | None = None

    @classmethod
    def of(cls, heads: dict[str, np.ndarray]) -> Outputs:
        """From a graph's named outputs (``logits``, ``q_halt_logits``, ``q_continue_logits``,
        ``steps_used`` where present; shapes as in :mod:`hrm_deploy.contract`)."""
        from hrm_deploy.contract import Q_LOGITS, STEPS_USED

        logits = np.asarray(heads["logits"], np.float32)
        n = len(logits)
        steps = np.asarray(heads[STEPS_USED], np.int32) if STEPS_USED in heads else None
        bad = (~np.isfinite(logits)).reshape(n, -1).sum(1)
        for name in Q_LOGITS:
            q = np.asarray(heads[name], np.float32).reshape(n, -1)  # [N, steps] (a step graph: [N, 1])
            defined = np.ones(q.shape, bool)
            if steps is not None:  # a loop graph: NaN after each row's halting step is the contract
                defined = np.arange(q.shape[1])[None, :] < steps[:, None]
            bad = bad + (~np.isfinite(q) & defined).sum(1)
        q_steps = np.asarray(heads[Q_LOGITS[0]], np.float32).reshape(n, -1)
        return cls(logits, q_steps[:, -1], steps, bad.astype(np.int64), q_steps)

    def __len__(self) -> int:
        return len(self.logits)

    def heads(self) -> dict[str, np.ndarray]:
        """The outputs as :func:`hrm_deploy.agreement.measure` reads them (``logits``,
        ``q_halt_logits`` [N, T], ``steps_used`` where the graph reports it)."""
        heads = {"logits": self.logits, "q_halt_logits": self.q_halt[:, None] if self.q_steps is None else self.q_steps}
        if self.steps is not None:
            heads["steps_used"] = self.steps
        return heads

    def join(self, more: Outputs) -> Outputs:
        """These rows, then ``more``'s."""
        return Outputs.concat([self, more])

    @staticmethod
    def concat(parts: list[Outputs]) -> Outputs:
        """The rows of ``parts``, in order (one copy, however many parts)."""
        steps = q_steps = None
        if all(p.steps is not None for p in parts):
            steps = np.concatenate([p.steps for p in parts if p.steps is not None])
        if (
            all(p.q_steps is not None for p in parts)
            and len({p.q_steps.shape[1:] for p in parts if p.q_steps is not None}) == 1
        ):
            q_steps = np.concatenate([p.q_steps for p in parts if p.q_steps is not None])
        return Outputs(
            np.concatenate([p.logits for p in parts]),
            np.concatenate([p.q_halt for p in parts]),
            steps,
            np.concatenate([p.nonfinite for p in parts]),
            q_steps,
        )

    def take(self, rows: np.ndarray | slice) -> Outputs:
        """The rows ``rows`` (indices or a slice), in that order."""
        steps = None if self.steps is None else self.steps[rows]
        q_steps = None if self.q_steps is None else self.q_steps[rows]
        return Outputs(self.logits[rows], self.q_halt[rows], steps, self.nonfinite[rows], q_steps)

    def head(self, count: int) -> Outputs:
        """The first ``count`` rows."""
        return self.take(slice(0, count))


def fragile_order(reference: Outputs) -> np.ndarray:
    """The row indices of ``reference`` (FP32's outputs), the puzzles FP32 was least sure of first:
    by the smaller of two ranks, that of its least sure cell (top-1 minus top-2 logit, over the
    cell's largest |logit|) and that of its last q_halt logit's distance from 0 (ties by index).
    Where FP32 is unsure is where a quantized graph's answers, cells and q_halt signs move
    (measured in docs/precision.md), so a failing candidate shows its failure early in this order."""
    n = len(reference)
    if n == 0:
        return np.zeros(0, np.int64)
    top = np.sort(reference.logits, -1)[..., -2:]  # [N, S, 2]
    scale = np.maximum(np.abs(reference.logits).max(-1), np.finfo(np.float32).tiny)  # [N, S]
    cell = np.nan_to_num(((top[..., 1] - top[..., 0]) / scale).min(1), nan=np.inf)  # [N]
    q = np.nan_to_num(np.abs(reference.q_halt), nan=np.inf)  # a loop graph's row that halted earlier: NaN

    def rank(values: np.ndarray) -> np.ndarray:
        ranks = np.empty(n, np.int64)
        ranks[np.argsort(values, kind="stable")] = np.arange(n)
        return ranks

    return np.lexsort((np.arange(n), np.minimum(rank(cell), rank(q)))).astype(np.int64)


@dataclass(frozen=True)
class Comparison:
    """A candidate against FP32, puzzle by puzzle: what the rule reads of each row. ``flipped`` [N]:
    the cells whose argmax differs from FP32's (of ``cells`` per puzzle); ``q_flip`` [N]: the last
    q_halt's sign differs; ``moved`` [N]: the halting step differs (None: the graph reports no
    steps); ``nonfinite`` [N]: the candidate's non-finite values; ``fp32_solved`` / ``solved`` [N]:
    FP32 and the candidate solve the puzzle (None without labels). The rest are verify's cell
    judgement (:func:`hrm_deploy.agreement.measure`) of each row, in the row's own units so any
    subset rescales them to its scale: ``scale`` [N], FP32's largest |logit|; ``sure_flip`` [N], FP32's
    largest top-1 minus top-2 margin at a flipped cell (0: none); ``cell_error`` [N] and
    ``agreeing_error`` [N], the largest |FP32 - candidate| logit of a cell, of a cell whose answer
    agrees; ``q_scale``, ``q_sure_flip``, ``q_error``, ``q_agreeing_error`` [N], the same of q_halt
    (its scale at least 1). Sums and maxima of rows, so any subset of puzzles is judged from the rows
    alone (:meth:`quality`)."""

    flipped: np.ndarray
    cells: int
    q_flip: np.ndarray
    moved: np.ndarray | None
    nonfinite: np.ndarray
    fp32_solved: np.ndarray | None
    solved: np.ndarray | None
    scale: np.ndarray
    sure_flip: np.ndarray
    cell_error: np.ndarray
    agreeing_error: np.ndarray
    q_scale: np.ndarray
    q_sure_flip: np.ndarray
    q_error: np.ndarray
    q_agreeing_error: np.ndarray

    @classmethod
    def of(cls, reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> Comparison:
        """``candidate`` against ``reference`` (FP32) on the same puzzles (``labels`` [N, S] or None)."""
        from hrm_deploy.metrics import solved_rows

        n = len(candidate)
        agree = (candidate.logits.argmax(-1) == reference.logits.argmax(-1)).reshape(n, -1)  # [N, S]
        moved = None
        if reference.steps is not None and candidate.steps is not None:
            moved = np.asarray(reference.steps != candidate.steps, bool)
        solved = fp32_solved = None
        if labels is not None:
            fp32_solved = np.asarray(solved_rows(reference.logits, labels), bool)
            solved = np.asarray(solved_rows(candidate.logits, labels), bool)
        return cls(
            flipped=(~agree).sum(1).astype(np.int64),
            cells=int(agree.shape[1]) if agree.ndim == 2 else 0,
            q_flip=np.asarray((reference.q_halt >= 0) != (candidate.q_halt >= 0), bool),
            moved=moved,
            nonfinite=np.asarray(candidate.nonfinite, np.int64),
            fp32_solved=fp32_solved,
            solved=solved,
            **_judged_rows(reference, candidate),
        )

    def rows(self) -> dict[str, np.ndarray]:
        """The per-row columns (those present), by name: what :meth:`from_rows` takes back."""
        return {
            f.name: value for f in fields(self) if f.name != "cells" and (value := getattr(self, f.name)) is not None
        }

    @classmethod
    def from_rows(cls, columns: dict[str, np.ndarray], cells: int) -> Comparison:
        """The comparison of the rows ``columns`` hold (:meth:`rows`' names; a column absent: None)."""
        values: dict[str, Any] = {f.name: columns.get(f.name) for f in fields(cls) if f.name != "cells"}
        return cls(cells=cells, **values)

    def __len__(self) -> int:
        return len(self.flipped)

    def quality(self) -> Quality:
        """The rule's measurement over these rows (see :class:`Quality`)."""
        n, cells = len(self), self.cells
        size = n * cells
        per_puzzle = 100.0 * (1.0 - (cells - self.flipped) / max(cells, 1))  # % of each puzzle's cells flipped
        spread = float(per_puzzle.std()) / math.sqrt(n) if n > 1 else 100.0
        common: dict[str, Any] = {
            "puzzles": n,
            "agreement": 100.0 * float((size - self.flipped.sum()) / max(size, 1)),
            "q_halt_agreement": 100.0 * float((n - self.q_flip.sum()) / max(n, 1)),
            "steps_agreement": None if self.moved is None else 100.0 * float((n - self.moved.sum()) / max(n, 1)),
            "nonfinite": int(self.nonfinite.sum()),
            "agreement_margin": Z * spread + 100.0 / max(size, 1),  # plus one cell more than seen
            **_judged(self),
        }
        if self.fp32_solved is None or self.solved is None:
            return Quality(**common)
        base, ours = self.fp32_solved, self.solved
        solved_cells = cells * int(base.sum())
        solved_agreement = None
        if solved_cells:
            solved_agreement = 100.0 * float((solved_cells - self.flipped[base].sum()) / solved_cells)
        return Quality(
            **common,
            fp32_exact=100.0 * float(base.sum() / max(n, 1)),
            exact=100.0 * float(ours.sum() / max(n, 1)),
            lost=int((base & ~ours).sum()),
            gained=int((~base & ours).sum()),
            solved_agreement=solved_agreement,
        )


def _judged_rows(reference: Outputs, candidate: Outputs) -> dict[str, np.ndarray]:
    """Verify's cell judgement of each row (:func:`hrm_deploy.agreement.measure`, one row at a time),
    in the row's own units (:class:`Comparison`'s cell columns)."""
    from hrm_deploy.agreement import measure

    n = len(candidate)
    columns = {name: np.zeros(n, np.float64) for names in _CELL_COLUMNS for name in names}
    ref_heads, cand_heads = reference.heads(), candidate.heads()
    for i in range(n):
        found = measure(
            {k: v[i : i + 1] for k, v in ref_heads.items()}, {k: v[i : i + 1] for k, v in cand_heads.items()}
        )
        for (scale, flip, error, agreeing), output in zip(_CELL_COLUMNS, (found.logits, found.q_halt), strict=True):
            if output is None:
                continue
            columns[scale][i] = output.scale
            columns[flip][i] = output.largest_flip_margin * output.scale
            columns[error][i] = output.max_abs
            columns[agreeing][i] = output.max_rel_agreeing * output.scale
    return columns


# Comparison's cell columns (scale, surest flip, largest error, largest error where the answers agree)
_CELL_COLUMNS = (
    ("scale", "sure_flip", "cell_error", "agreeing_error"),
    ("q_scale", "q_sure_flip", "q_error", "q_agreeing_error"),
)


def _judged(rows: Comparison) -> dict[str, float]:
    """The cell judgement's measures over ``rows``, as fractions of their scale (verify's: FP32's
    largest |logit| over all of them; q_halt's at least 1)."""
    if not len(rows):
        return {}
    scale, q_scale = float(rows.scale.max()), max(float(rows.q_scale.max()), 1.0)
    return {
        "sure_flip": float(rows.sure_flip.max()) / scale,
        "cell_error": float(rows.cell_error.max()) / scale,
        "agreeing_error": float(rows.agreeing_error.max()) / scale,
        "q_sure_flip": float(rows.q_sure_flip.max()) / q_scale,
        "q_error": float(rows.q_error.max()) / q_scale,
        "q_agreeing_error": float(rows.q_agreeing_error.max()) / q_scale,
    }


# ----------------------------------------------------------------------------------------------- quality
def _discordance_margin(discordant: int, n: int) -> float:
    """One-sided margin, in percent, of a rate measured from ``discordant`` events in ``n`` units:
    ``Z sqrt(d + 1) / n`` (one more event than seen)."""
    return 100.0 * Z * math.sqrt(discordant + 1) / max(n, 1)


@dataclass(frozen=True)
class Quality:
    """A candidate against FP32 on ``puzzles`` held-out puzzles. Percentages: ``agreement`` of output
    cells with FP32's argmax (``agreement_margin``: its one-sided margin from the spread of the
    per-puzzle rates), ``q_halt_agreement`` of rows whose last q_halt has FP32's sign, and
    ``steps_agreement`` of rows halting at FP32's step (None: the graph does not report its steps);
    ``nonfinite``: non-finite values in the candidate's outputs. With labels: ``fp32_exact`` /
    ``exact`` in percent, ``lost`` / ``gained`` paired flips, and ``solved_agreement``, the argmax
    agreement over the cells of puzzles FP32 solves (recorded, not judged: docs/precision.md)."""

    puzzles: int
    agreement: float
    q_halt_agreement: float = 100.0
    steps_agreement: float | None = None
    nonfinite: int = 0
    fp32_exact: float | None = None
    exact: float | None = None
    lost: int = 0
    gained: int = 0
    agreement_margin: float = 0.0
    solved_agreement: float | None = None
    # verify's cell judgement, fractions of the scale (:func:`hrm_deploy.agreement.measure`): FP32's
    # largest top-1 minus top-2 margin at a flipped cell (0: none), the largest error of any cell and
    # of a cell whose answer agrees; the same of q_halt (sign flips; every step both ran)
    sure_flip: float = 0.0
    cell_error: float = 0.0
    agreeing_error: float = 0.0
    q_sure_flip: float = 0.0
    q_error: float = 0.0
    q_agreeing_error: float = 0.0

    @property
    def loss(self) -> float:
        """Exact-accuracy points lost, from the paired flips (negative: gained; 0 without labels)."""
        if self.fp32_exact is None or self.exact is None:
            return 0.0
        return 100.0 * (self.lost - self.gained) / max(self.puzzles, 1)

    def loss_margin(self) -> float:
        """Half-width in points of the one-sided interval of the loss from the paired flips."""
        return _discordance_margin(self.lost + self.gained, self.puzzles)

    def describe(self) -> str:
        """One phrase, losses and gains in words."""
        parts = []
        if self.fp32_exact is not None and self.exact is not None:
            word = "gained" if self.loss < 0 else "lost"
            parts.append(
                f"exact {self.exact:.2f} % vs FP32 {self.fp32_exact:.2f} % ({abs(self.loss):.2f} points {word}: "
                f"{self.lost} puzzles lost, {self.gained} gained)"
            )
        parts.append(f"argmax agreement {self.agreement:.2f} %")
        parts.append(f"q_halt signs {self.q_halt_agreement:.2f} %")
        if self.steps_agreement is not None:
            parts.append(f"halting steps {self.steps_agreement:.2f} %")
        if self.nonfinite:
            parts.append(f"{self.nonfinite} non-finite values")
        parts.append(f"cells within {self.cell_error:.3g} of the scale")
        if self.sure_flip:
            parts.append(f"surest flip {self.sure_flip:.3g}")
        return f"{', '.join(parts)} on {self.puzzles} puzzles"

    def as_dict(self) -> dict[str, Any]:
        """The manifest's record of this measurement."""
        return {
            "fp32_exact_pct": self.fp32_exact,
            "exact_pct": self.exact,
            "loss_points": round(self.loss, 4),
            "argmax_agreement_pct": round(self.agreement, 4),
            "solved_cells_agreement_pct": None if self.solved_agreement is None else round(self.solved_agreement, 4),
            "q_halt_sign_agreement_pct": round(self.q_halt_agreement, 4),
            "steps_agreement_pct": None if self.steps_agreement is None else round(self.steps_agreement, 4),
            "nonfinite_values": self.nonfinite,
            "holdout_puzzles": self.puzzles,
            "puzzles_lost": self.lost,
            "puzzles_gained": self.gained,
            "largest_flip_margin": round(self.sure_flip, 6),
            "largest_cell_error": round(self.cell_error, 6),
            "largest_error_where_answers_agree": round(self.agreeing_error, 6),
            "largest_q_halt_flip": round(self.q_sure_flip, 6),
            "largest_q_halt_error": round(self.q_error, 6),
            "largest_q_halt_error_where_signs_agree": round(self.q_agreeing_error, 6),
        }

    def completed(self, left: int, unsolved: int) -> Quality:
        """The best this measurement can become once ``left`` more puzzles are measured: each agrees
        with FP32 on every cell, q_halt sign and halting step, and every one of them FP32 does not
        solve (``unsolved``) is gained. A check this fails, every completion fails (each check's
        value only improves toward this bound). Argmax agreement's margin, from the spread of the
        per-puzzle rates, has no such bound: it is infinite here, so that check never fails clearly."""
        n = self.puzzles + left

        def grown(pct: float) -> float:
            return (pct * self.puzzles + 100.0 * left) / max(n, 1)

        return replace(
            self,
            puzzles=n,
            agreement=grown(self.agreement),
            q_halt_agreement=grown(self.q_halt_agreement),
            steps_agreement=None if self.steps_agreement is None else grown(self.steps_agreement),
            gained=self.gained + (unsolved if self.fp32_exact is not None else 0),
            agreement_margin=math.inf,
        )

    def one_more(self) -> Quality:
        """This measurement with one more of each failure than seen: a puzzle lost, a q_halt sign and
        a halting step moved. A screen's estimate (it sees only part of the holdout, the rest counted
        as FP32 answered it, so its estimate leans toward passing) must pass with these to spare."""
        step = 100.0 / max(self.puzzles, 1)
        return replace(
            self,
            lost=self.lost + (1 if self.fp32_exact is not None else 0),
            q_halt_agreement=max(0.0, self.q_halt_agreement - step),
            steps_agreement=None if self.steps_agreement is None else max(0.0, self.steps_agreement - step),
        )


def quality(reference: Outputs, candidate: Outputs, labels: np.ndarray | None) -> Quality:
    """``candidate`` against ``reference`` (FP32) on the same puzzles (``labels`` [N, S] or None)."""
    return Comparison.of(reference, candidate, labels).quality()


# ----------------------------------------------------------------------------------------------- the rule
@dataclass(frozen=True)
class Check:
    """One criterion: ``value`` against ``limit`` (``at_least``: the value must not fall below it;
    else not exceed it), with the one-sided ``margin`` of its measurement."""

    name: str
    value: float
    limit: float
    margin: float = 0.0
    at_least: bool = True
    digits: str = ".2f"  # how its value and limit are written

    @property
    def passes(self) -> bool:
        return self.value >= self.limit if self.at_least else self.value <= self.limit

    @property
    def clear(self) -> bool:
        """Decided at this sample size: the value is beyond its margin on either side of the limit
        (a check without a margin, a count that must be zero, always is)."""
        return self.margin == 0 or abs(self.value - self.limit) > self.margin

    def words(self) -> str:
        sign = ">=" if self.at_least else "<="
        return f"{self.name} {self.value:{self.digits}} (needs {sign} {self.limit:g})"


def verify_view(quality: Quality, thresholds: Thresholds) -> list[Check]:
    """What ``verify`` judges of an artifact at these thresholds (the precision's ``PRECISIONS``
    row), as the build can measure it against the FP32 graph: argmax agreement over all cells,
    q_halt sign agreement, and for a graph that halts inside, the rows halting at FP32's step
    (held to the q_halt threshold, as verify holds them). The one place the rule follows verify:
    when verify's judge changes, this body changes with it."""
    n = quality.puzzles
    q_flips = round(n * (100.0 - quality.q_halt_agreement) / 100.0)
    checks = [
        Check(
            "argmax agreement %", quality.agreement, 100.0 * thresholds.min_argmax_agreement, quality.agreement_margin
        ),
        Check(
            "q_halt sign agreement %",
            quality.q_halt_agreement,
            100.0 * thresholds.min_q_halt_sign_agreement,
            _discordance_margin(q_flips, n),
        ),
    ]
    if quality.steps_agreement is not None:
        moved = round(n * (100.0 - quality.steps_agreement) / 100.0)
        checks.append(
            Check(
                "halting steps agreement %",
                quality.steps_agreement,
                100.0 * thresholds.min_q_halt_sign_agreement,
                _discordance_margin(moved, n),
            )
        )
    return checks + cell_checks(quality, thresholds)


def cell_checks(quality: Quality, thresholds: Thresholds) -> list[Check]:
    """Verify's cell judgement (:mod:`hrm_deploy.agreement`: its flip bounds and band) of the
    measured fractions of the scale: no answer flipped where FP32 was sure (its top-1 minus top-2
    margin over :func:`~hrm_deploy.agreement.flip_margin`), no cell beyond
    :data:`~hrm_deploy.agreement.CELL_BAND` x the closeness threshold, no agreeing cell beyond
    closeness; the same of q_halt. Each is a maximum: one row decides it, no margin."""
    from hrm_deploy.agreement import CELL_BAND, flip_margin, q_halt_flip

    logits, q_halt = thresholds.max_logits_rel_error, thresholds.max_q_halt_rel_error
    limits = (
        ("FP32's margin at a flipped answer", quality.sure_flip, flip_margin(thresholds)),
        ("a cell's logit error", quality.cell_error, CELL_BAND * logits),
        ("a logit error where the answers agree", quality.agreeing_error, logits),
        ("FP32's abs(q_halt) at a flipped sign", quality.q_sure_flip, q_halt_flip(thresholds)),
        ("a q_halt error", quality.q_error, CELL_BAND * q_halt),
        ("a q_halt error where the signs agree", quality.q_agreeing_error, q_halt),
    )
    return [Check(f"{name} (of the scale)", value, limit, 0.0, False, ".3g") for name, value, limit in limits]


@dataclass(frozen=True)
class Rule:
    """The accuracy rule of one build: ``budget`` exact-accuracy points and ``thresholds``, the
    precision's ``PRECISIONS`` row (what verify asks). The one function every target's build judges by."""

    budget: float
    thresholds: Thresholds

    @classmethod
    def of(cls, precision: str, budget: float | None = None) -> Rule:
        """The rule of a build at ``precision`` (its row's thresholds) with ``budget`` (None: the default)."""
        row = PRECISIONS[precision]
        return cls(DEFAULT_BUDGET_POINTS if budget is None else float(budget), row.thresholds)

    def checks(self, quality: Quality) -> list[Check]:
        """Every criterion of the rule on one measurement (see the module docstring)."""
        found = [Check("non-finite output values", float(quality.nonfinite), 0.0, 0.0, at_least=False)]
        if quality.fp32_exact is not None:
            found.append(Check("exact-accuracy points lost", quality.loss, self.budget, quality.loss_margin(), False))
        return found + verify_view(quality, self.thresholds)

    def failures(self, quality: Quality) -> list[str]:
        """The checks ``quality`` fails, in words (empty: within the rule)."""
        return [check.words() for check in self.checks(quality) if not check.passes]

    def within(self, quality: Quality) -> bool:
        return not self.failures(quality)

    def certainly_fails(self, best: Quality, final: bool) -> bool:
        """Whether a measurement whose best completion is ``best`` (:meth:`Quality.completed`) fails
        however the puzzles not yet run turn out: ``final``, where the measured values decide (the
        holdout can grow no more), outside the rule; else outside it clearly (a check failing by more
        than its margin: more puzzles would not be measured)."""
        if final:
            return not self.within(best)
        return any(not check.passes and check.clear for check in self.checks(best))

    def settled(self, quality: Quality) -> bool:
        """Whether more puzzles could change the verdict: False while no check fails clearly and
        some check is within its margin of its limit."""
        checks = self.checks(quality)
        return any(not c.passes and c.clear for c in checks) or all(c.clear for c in checks)

    def describe(self) -> str:
        """The rule in words, for refusals."""
        t = self.thresholds
        return (
            f"<= {self.budget:g} points lost, >= {100 * t.min_argmax_agreement:g} % argmax agreement, "
            f">= {100 * t.min_q_halt_sign_agreement:g} % q_halt signs and halting steps, no non-finite output, "
            "no answer or q_halt sign flipped where FP32 was sure, no cell beyond verify's band"
        )


# ----------------------------------------------------------------------------------------------- words
def accuracy_line(name: str, quality: Quality, rule: Rule, fallback: bool) -> str:
    """The one line a build prints of its published graph's accuracy."""
    measured = quality.describe().rsplit(" on ", 1)[0]
    kept = "; sensitive layers kept float" if fallback else ""
    return (
        f"{name} vs FP32 on {quality.puzzles} held-out puzzles: {measured} (budget {rule.budget:g} points lost{kept})"
    )


def refusal(what: str, first: Quality, final: Quality, kept: int, rule: Rule, tried: int | None = None) -> str:
    """The one line of a build refused by the rule after its fallback: both measurements (``final``:
    the last mix measured, with ``kept`` layers float; ``tried``: the most any screen kept) and the
    options that can help (a larger budget only where the points lost are what fails)."""
    failures = rule.failures(final)
    failing = "; ".join(failures) or "not settled within the rule"
    more = f" (screens tried up to {tried} layers float)" if tried is not None and tried > kept else ""
    options = "build a float precision (--fp16, --bf16 or --fp32)"
    if any("points lost" in line for line in failures):
        options = "pass a larger --accuracy-budget, or " + options
    return (
        f"{what} is outside the accuracy rule ({rule.describe()}) even with {kept} layers kept float: "
        f"{final.describe()} ({failing}; all quantized: {first.describe()}); nothing was written{more}. "
        f"{options[0].upper()}{options[1:]}"
    )
