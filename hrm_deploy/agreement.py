"""How far a candidate's outputs are from a reference's, judged cell by cell: what ``verify`` asks of
an artifact, and what a quantized build's accuracy rule can ask of the graph it writes.

Arrays in, a frozen :class:`Agreement` out, no I/O. The arrays are a runner's outputs
(:mod:`hrm_deploy.runtime.base`): ``logits`` [N, S, V]; where present, ``q_halt_logits`` and
``q_continue_logits`` [N, T] (one column per ACT step) and ``steps_used`` [N] (the steps each row
ran: a column past it is not an output of that row, e.g. the NaN a halted row is padded with).

A candidate fails (one line each, :meth:`Agreement.failures`) where

1. any output holds a non-finite value (NaN, inf) at a step its row ran (the line names the output,
   how many values and the first puzzle and position). A non-finite value in the *reference* is the
   reference's fault, not the candidate's: :class:`NonFiniteReference`, and no verdict;
2. a cell's answer (its argmax over the vocabulary) flipped where the reference was sure of it: the
   reference's top-1 minus top-2 margin there is over ``max_flip_margin`` (None: the closeness
   threshold) of the *scale* (the reference's largest |logit|, the scale closeness is measured in). A lower precision flips cells
   where the reference hesitated between two answers: those are excused, only counted
   (``min_argmax_agreement``). The worst flips (largest reference margins) are listed;
3. any cell, flipped or not, is further from the reference than :data:`CELL_BAND` x
   ``max_logits_rel_error`` of the scale: no cell is arbitrarily far;
4. a cell whose answer agrees is further than ``max_logits_rel_error`` of the scale (closeness);
5. fewer than ``min_argmax_agreement`` of the cells agree;
6. for ``q_halt``, the same at every step both ran, its scale max(|q_halt|, 1): a sign flip where
   the reference's |q_halt| is over ``max_q_halt_flip`` (None: its closeness threshold) of the scale, any value further than
   :data:`CELL_BAND` x ``max_q_halt_rel_error``, a value of the same sign further than
   ``max_q_halt_rel_error``, and signs agreeing on fewer than ``min_q_halt_sign_agreement`` of the
   rows at each row's last step.

The tolerance is any object with those six attributes (:class:`Tolerance`):
:class:`hrm_deploy.precision.registry.Thresholds`, a precision's row, is one. ``verify`` measures
(:func:`measure`) and judges its report (:meth:`Agreement.failures`); a build holding its graph to
verify's thresholds calls :func:`judge_cells` with the FP32 graph's outputs as the reference, e.g.
``judge_cells({"logits": fp32}, {"logits": int8}, PRECISIONS["int8"].thresholds, "the FP32 graph")``
(an output either side lacks, q_halt here, is not judged).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from hrm_deploy.errors import HRMDeployError

if TYPE_CHECKING:
    from typing_extensions import Self

# No cell may be further from the reference than this many times the closeness threshold, flipped or
# not (as the export's parity limits keep an argmax band, parity_limits.ARGMAX_BAND). Measured on every
# real build of the bundled models that passes verify (benchmarks/verify_margins.py, docs/guarantees.md):
# at most 1.23 times (a flipped cell of the bundled sudoku-small's cpu blockwise INT8), q_halt 1.10 times
CELL_BAND = 2.0
WORST = 5  # flips listed in a report and a failure line
FINITE_OUTPUTS = ("logits", "q_halt_logits", "q_continue_logits", "steps_used")


class NonFiniteReference(HRMDeployError):
    """The reference's own outputs hold NaN or inf: no verdict on a candidate can be given."""


class Tolerance(Protocol):
    """What a candidate is held to (fractions and fractions of a scale; see the module docstring)."""

    @property
    def min_argmax_agreement(self) -> float: ...
    @property
    def min_q_halt_sign_agreement(self) -> float: ...
    @property
    def max_logits_rel_error(self) -> float: ...
    @property
    def max_q_halt_rel_error(self) -> float: ...
    @property
    def max_flip_margin(self) -> float | None: ...  # None: max_logits_rel_error
    @property
    def max_q_halt_flip(self) -> float | None: ...  # None: max_q_halt_rel_error


@dataclass(frozen=True)
class NonFinite:
    """Non-finite values of one output: how many, and the first (puzzle, position) holding one
    (``position``: the sequence position for logits, the ACT step (1-based) for per-step outputs)."""

    output: str
    count: int
    puzzle: int
    position: int

    def line(self, whose: str) -> str:
        where = {"logits": f", position {self.position}", "steps_used": ""}.get(self.output, f", step {self.position}")
        return (
            f"{whose} {self.output} hold {self.count} non-finite value{'s' if self.count > 1 else ''} (NaN or inf), "
            f"the first at puzzle {self.puzzle}{where}"
        )


@dataclass(frozen=True)
class Flip:
    """A cell (or a q_halt step) whose answer flipped. For logits, ``reference_margin`` is the
    reference's top-1 minus top-2 and ``candidate_margin`` how much the candidate prefers its answer
    over the reference's; for q_halt, the two values; all as fractions of the output's scale."""

    puzzle: int
    position: int
    reference_margin: float
    candidate_margin: float

    def text(self, where: str = "position") -> str:
        return (
            f"puzzle {self.puzzle} {where} {self.position} (reference {self.reference_margin:.3g}, "
            f"candidate {self.candidate_margin:.3g} of the scale)"
        )


@dataclass(frozen=True)
class OutputAgreement:
    """One output compared. ``scale``: the reference's largest |value| (q_halt: at least 1);
    ``max_rel`` (every cell) and ``max_rel_agreeing`` (cells whose answers agree): a cell's largest
    error over the scale; ``agreement``: the fraction that agrees; ``flips``: how many flipped;
    ``worst_flips``: those where the reference was surest, surest first (at most :data:`WORST`)."""

    KEY: ClassVar[str] = "agreement"  # the agreement's name in a report

    scale: float
    max_abs: float
    max_rel: float
    max_rel_agreeing: float
    agreement: float
    flips: int = 0
    worst_flips: tuple[Flip, ...] = ()

    @property
    def largest_flip_margin(self) -> float:
        """The reference's margin (or |q_halt|) at its surest flip (0 without flips), of the scale."""
        return self.worst_flips[0].reference_margin if self.worst_flips else 0.0

    def as_dict(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values[self.KEY] = values.pop("agreement")
        values["worst_flips"] = [vars(f) for f in self.worst_flips]
        values["largest_flip_margin"] = self.largest_flip_margin
        return values

    @classmethod
    def from_dict(cls, found: Mapping[str, Any]) -> Self:
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in found.items() if k in names}
        values["agreement"] = found[cls.KEY]
        values["worst_flips"] = tuple(Flip(**f) for f in found.get("worst_flips", ()))
        return cls(**values)


class LogitsAgreement(OutputAgreement):
    """The answers' logits [N, S, V], cell by cell (a cell: one position of one puzzle); its
    agreement is the argmax agreement, its flips answers that changed."""

    KEY = "argmax_agreement"

    @property
    def argmax_agreement(self) -> float:
        return self.agreement


class QHaltAgreement(OutputAgreement):
    """q_halt [N, T] at every step both ran (``max_rel``; flips: sign flips) and at each row's last
    such step (``max_rel_agreeing`` where the signs agree; its agreement, the sign agreement)."""

    KEY = "sign_agreement"

    @property
    def sign_agreement(self) -> float:
        return self.agreement


@dataclass(frozen=True)
class Agreement:
    """The candidate against the reference (see the module docstring); ``q_halt`` None where either
    side has no q_halt output; ``nonfinite``: the candidate's outputs that hold non-finite values."""

    logits: LogitsAgreement
    q_halt: QHaltAgreement | None = None
    nonfinite: tuple[NonFinite, ...] = ()

    def failures(self, tolerance: Tolerance) -> tuple[str, ...]:
        """One line per way the candidate misses ``tolerance`` (empty: it passes)."""
        lines = [bad.line("the candidate's") for bad in self.nonfinite]
        lines += _logits_failures(self.logits, tolerance)
        if self.q_halt is not None:
            lines += _q_halt_failures(self.q_halt, tolerance)
        return tuple(lines)

    def as_dict(self) -> dict[str, Any]:
        """The measures as plain JSON-able data (:meth:`from_dict` reads them back)."""
        return {
            "logits": self.logits.as_dict(),
            **({"q_halt": self.q_halt.as_dict()} if self.q_halt is not None else {}),
            "nonfinite": [vars(bad) for bad in self.nonfinite],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Agreement:
        """The measures :meth:`as_dict` wrote (a verify report's ``logits``, ``q_halt``, ``nonfinite``)."""
        q_halt = data.get("q_halt")
        return cls(
            LogitsAgreement.from_dict(data["logits"]),
            QHaltAgreement.from_dict(q_halt) if q_halt is not None else None,
            tuple(NonFinite(**bad) for bad in data.get("nonfinite", ())),
        )


@dataclass(frozen=True)
class Verdict:
    """:func:`judge_cells`' answer: the measures and the lines of what failed."""

    agreement: Agreement
    failures: tuple[str, ...]

    @property
    def passed(self) -> bool:
        return not self.failures


def judge_cells(
    reference: Mapping[str, np.ndarray],
    candidate: Mapping[str, np.ndarray],
    tolerance: Tolerance,
    reference_name: str = "the reference",
) -> Verdict:
    """:func:`measure` the candidate against the reference and judge it by ``tolerance``."""
    agreement = measure(reference, candidate, reference_name)
    return Verdict(agreement, agreement.failures(tolerance))


def measure(
    reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray], reference_name: str = "the reference"
) -> Agreement:
    """The candidate's outputs against the reference's (the module docstring says which arrays).
    Raises :class:`NonFiniteReference` (naming ``reference_name``) where the reference's hold NaN or inf."""
    ref_steps, cand_steps = _steps(reference), _steps(candidate)
    bad_ref = _nonfinite(reference, ref_steps)
    if bad_ref:
        whose = f"{reference_name}'s"
        raise NonFiniteReference(
            f"{bad_ref[0].line(whose)}: the reference is at fault, not the candidate, and no "
            "verdict can be given; check the reference model (its checkpoint, or its FP32 graph) and its data"
        )
    q_ref, q_cand = reference.get("q_halt_logits"), candidate.get("q_halt_logits")
    q_halt = None
    if q_ref is not None and q_cand is not None:
        q_halt = _q_halt(_columns(q_ref), _columns(q_cand), ref_steps, cand_steps)
    return Agreement(_logits(reference["logits"], candidate["logits"]), q_halt, _nonfinite(candidate, cand_steps))


# ---------------------------------------------------------------------------------------------- measuring
def _columns(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, np.float64)
    return values.reshape(len(values), -1)  # [N] (one step) -> [N, 1]


def _steps(outputs: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """Steps each row ran [N] (int), None when the outputs do not say (every column is a step run)."""
    used = outputs.get("steps_used")
    if used is None:
        return None
    used = np.asarray(used, np.float64).reshape(-1)
    return np.where(np.isfinite(used), used, np.inf)  # a non-finite count is judged, not used to mask


def _ran(values: np.ndarray, steps: np.ndarray | None) -> np.ndarray:
    """[N, T] mask of the steps each row ran."""
    if steps is None:
        return np.ones(values.shape, bool)
    return np.arange(values.shape[1])[None, :] < steps[:, None]


def _nonfinite(outputs: Mapping[str, np.ndarray], steps: np.ndarray | None) -> tuple[NonFinite, ...]:
    found = []
    for name in FINITE_OUTPUTS:
        values = outputs.get(name)
        if values is None or np.asarray(values).dtype.kind != "f":
            continue
        values = np.asarray(values)
        if name == "logits":
            bad = ~np.isfinite(values).all(-1)  # [N, S]
        elif name == "steps_used":
            bad = ~np.isfinite(values.reshape(len(values), -1))
        else:
            values = _columns(values)
            bad = ~np.isfinite(values) & _ran(values, steps)
        if bad.any():
            puzzle, position = np.argwhere(bad)[0]
            count = int((~np.isfinite(values)).sum()) if name == "logits" else int(bad.sum())
            step_based = name in ("q_halt_logits", "q_continue_logits")
            found.append(NonFinite(name, count, int(puzzle), int(position) + (1 if step_based else 0)))
    return tuple(found)


def _top2(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(top-1, top-2) values per cell of [N, S, V] (top-2 = top-1 for a vocabulary of one)."""
    if logits.shape[-1] < 2:
        return logits[..., 0], logits[..., 0]
    part = np.partition(logits, -2, axis=-1)
    return part[..., -1], part[..., -2]


def _logits(ref: np.ndarray, cand: np.ndarray) -> LogitsAgreement:
    ref, cand = np.asarray(ref, np.float64), np.asarray(cand, np.float64)
    if ref.shape != cand.shape:
        from hrm_deploy.errors import ArtifactError

        raise ArtifactError(
            f"the candidate's logits are {list(cand.shape)} but the reference's {list(ref.shape)}: it is not the "
            "same model (another vocabulary or sequence length); compare it with the checkpoint it was made from"
        )
    scale = max(float(np.abs(ref).max(initial=0.0)), 1e-6)
    finite = np.isfinite(cand).all(-1)  # [N, S]; the others are named by the non-finite line
    error = np.where(finite, np.abs(ref - np.where(np.isfinite(cand), cand, 0.0)).max(-1), 0.0)  # [N, S]
    ref_answer, cand_answer = ref.argmax(-1), np.where(finite, cand.argmax(-1), -1)
    agree = ref_answer == cand_answer
    top1, top2 = _top2(ref)
    flipped = np.argwhere(finite & ~agree)
    margin = (top1 - top2)[finite & ~agree] / scale
    order = np.argsort(-margin, kind="stable")
    take = np.take_along_axis
    cand_top = take(cand, cand_answer[..., None].clip(0), -1)[..., 0]
    cand_at_ref = take(cand, ref_answer[..., None], -1)[..., 0]
    prefer = (cand_top - cand_at_ref)[finite & ~agree] / scale
    worst = tuple(
        Flip(int(flipped[i, 0]), int(flipped[i, 1]), float(margin[i]), float(prefer[i])) for i in order[:WORST]
    )
    return LogitsAgreement(
        scale=scale,
        max_abs=float(error.max(initial=0.0)),
        max_rel=float(error.max(initial=0.0) / scale),
        max_rel_agreeing=float(error[agree].max(initial=0.0) / scale),
        agreement=float(agree.mean()) if agree.size else 1.0,
        flips=len(flipped),
        worst_flips=worst,
    )


def _q_halt(
    ref: np.ndarray, cand: np.ndarray, ref_steps: np.ndarray | None, cand_steps: np.ndarray | None
) -> QHaltAgreement:
    width = min(ref.shape[1], cand.shape[1])
    ref, cand = ref[:, :width], cand[:, :width]
    both = _ran(ref, ref_steps) & _ran(cand, cand_steps) & np.isfinite(cand)  # [N, width]
    rows = both.any(1)
    last = width - 1 - np.argmax(both[:, ::-1], axis=1)  # each row's last step both ran (0 for none)
    scale = max(float(np.abs(np.where(both, ref, 0.0)).max(initial=0.0)), 1.0)
    error = np.where(both, np.abs(ref - np.where(both, cand, 0.0)), 0.0)
    same = (ref >= 0) == (cand >= 0)
    at_last = np.arange(len(ref)), last
    final_same = same[at_last] & rows
    flipped = np.argwhere(both & ~same)
    size = np.abs(ref[both & ~same]) / scale
    order = np.argsort(-size, kind="stable")
    values = cand[both & ~same] / scale
    worst = tuple(
        Flip(int(flipped[i, 0]), int(flipped[i, 1]) + 1, float(size[i]), float(values[i])) for i in order[:WORST]
    )
    return QHaltAgreement(
        scale=scale,
        max_abs=float(error.max(initial=0.0)),
        max_rel=float(error.max(initial=0.0) / scale),
        max_rel_agreeing=float(np.where(final_same, error[at_last], 0.0).max(initial=0.0) / scale),
        agreement=float(final_same[rows].mean()) if rows.any() else 1.0,
        flips=len(flipped),
        worst_flips=worst,
    )


# ---------------------------------------------------------------------------------------------- judging
def flip_margin(tolerance: Tolerance) -> float:
    """The largest reference margin (a fraction of the scale) at which a flipped answer is excused."""
    margin = tolerance.max_flip_margin
    return tolerance.max_logits_rel_error if margin is None else margin


def q_halt_flip(tolerance: Tolerance) -> float:
    """The largest reference |q_halt| (a fraction of its scale) at which a sign flip is excused."""
    near = tolerance.max_q_halt_flip
    return tolerance.max_q_halt_rel_error if near is None else near


def _flip_line(measured: OutputAgreement, bound: float, what: str, how: str, where: str) -> str | None:
    """The line for the flips where the reference was sure (None when every flip is within ``bound``)."""
    if measured.largest_flip_margin <= bound:
        return None
    sure = [f for f in measured.worst_flips if f.reference_margin > bound]
    return (
        f"{what} flipped where the reference was sure ({how} over {bound} of the scale {measured.scale:.3g}); "
        f"the worst: {'; '.join(f.text(where) for f in sure)} ({measured.flips} flipped in all)"
    )


@dataclass(frozen=True)
class _Words:
    """How the lines of one output speak of it."""

    name: str  # the output
    flipped: str  # what flipped
    sure: str  # what made the reference sure
    where: str  # a flip's place after its puzzle
    far: str  # the subject of the band's line
    unit: str  # what the band bounds
    agreeing: str  # what agrees where closeness is judged
    agreement: str  # the agreement measured


_LOGITS = _Words(
    "logits", "answers", "its top-1 minus top-2 margin", "position", "a cell's logits are", "cell", "answers",
    "argmax agreement",
)  # fmt: skip
_Q_HALT = _Words(
    "q_halt", "q_halt signs", "its abs(q_halt)", "step", "a q_halt value is", "value", "signs", "q_halt sign agreement"
)


def _section_failures(
    measured: OutputAgreement, flip_bound: float, closeness: float, least: float, words: _Words
) -> list[str]:
    """The lines of one output: flips where the reference was sure, the band, closeness, agreement."""
    flips = _flip_line(measured, flip_bound, words.flipped, words.sure, words.where)
    lines = [flips] if flips else []
    band = CELL_BAND * closeness
    if measured.max_rel > band:
        lines.append(
            f"{words.far} {measured.max_rel:.4g} of the scale from the reference's > {band:.4g} "
            f"({CELL_BAND:g} x the closeness threshold, the bound on every {words.unit})"
        )
    if measured.max_rel_agreeing > closeness:
        lines.append(
            f"{words.name} relative error where the {words.agreeing} agree {measured.max_rel_agreeing:.4g} > "
            f"{closeness}"
        )
    if measured.agreement < least:
        lines.append(f"{words.agreement} {measured.agreement:.4f} < {least}")
    return lines


def _logits_failures(measured: LogitsAgreement, tolerance: Tolerance) -> list[str]:
    closeness, least = tolerance.max_logits_rel_error, tolerance.min_argmax_agreement
    return _section_failures(measured, flip_margin(tolerance), closeness, least, _LOGITS)


def _q_halt_failures(measured: QHaltAgreement, tolerance: Tolerance) -> list[str]:
    closeness, least = tolerance.max_q_halt_rel_error, tolerance.min_q_halt_sign_agreement
    return _section_failures(measured, q_halt_flip(tolerance), closeness, least, _Q_HALT)
