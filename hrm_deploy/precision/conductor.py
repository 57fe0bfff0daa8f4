"""The conductor of every quantized build: measure candidates against the rule, fall back, and say
which graph to publish.

One function, :func:`conduct`, serves every target: the precision stage's INT8/FP8/NVFP4 graphs for
TensorRT (:mod:`hrm_deploy.precision.convert`), the cpu target's static INT8
(:mod:`hrm_deploy.backends.ort.builder.static`), step, unrolled and loop graphs. A target hands it
its :class:`Candidates` (how it writes the graph it would publish with a given set of nodes kept
float) and how a graph runs; the conductor does the rest, the same way for all:

1. **estimate** before measuring: the puzzles the verdict needs and their time, from the calibration
   pass's measured FP32 cost per puzzle; the progress line then says how much is left;
2. **certify** the all-quantized candidate on the holdout: FP32 runs once per puzzle, then the
   candidate runs the puzzles FP32 was least sure of first (where quantization moves answers,
   cells and q_halt signs) and stops as soon as its failure is certain, when even the best the
   puzzles left could do leaves it outside the rule; a pass counts only on the whole holdout (which
   grows while its verdict is within the noise: :meth:`~hrm_deploy.precision.holdout.Holdout.decide`);
3. outside the rule, the **fallback**: the weights are ranked once (each one's own output error, one
   pass: :mod:`hrm_deploy.precision.sensitivity`) and the float set is searched
   (:mod:`hrm_deploy.precision.fallback`: galloping up from one weight, then bisecting) on
   **screens**: a candidate runs only the *front* of the holdout, the puzzles the all-quantized
   candidate ran before its failure was certain (those FP32 was least sure of), every other
   puzzle counted as FP32 answered it, and passes only with one more lost puzzle, q_halt sign and
   halting step to spare than it showed (its estimate leans toward passing); a screen stops as
   soon as its failure is certain. The chosen candidate is certified on the whole holdout, its
   screen's puzzles not run again (the same file); a certification that fails adds the puzzles it
   ran to the front and sends the search to larger float sets;
4. the graph to **publish** is the file certified last: the very bytes measured, its float set by
   node name in the record. Outside the rule after the fallback, the build is refused in one line
   with both measurements.

The record counts the work deterministically (puzzle runs of FP32 and of candidates, by kind, and
candidate graphs written) beside the seconds, so a build's cost can be compared across machines.

Every step is deterministic for the same inputs (no clock decides anything), so the same build
gives the same verdict, float set and graph.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from hrm_deploy.errors import ConfigError
from hrm_deploy.precision.fallback import MAX_CERTIFICATIONS, MAX_SCREENS, Search, weight_groups
from hrm_deploy.precision.holdout import Decision, Holdout, Run, growth_cap
from hrm_deploy.precision.rule import Quality, Rule, accuracy_line, refusal

if TYPE_CHECKING:
    from onnx import ModelProto

    from hrm_deploy.precision.job import QuantJob
    from hrm_deploy.progress import Stages

log = logging.getLogger(__name__)


class Candidates(Protocol):
    """How a target writes its quantized graphs. ``name`` names them in lines ("INT8", "static
    INT8"); :meth:`write` writes, at ``out``, the graph the target would publish with the nodes
    ``exclude`` kept float (every step a published graph goes through: the measured bytes are the
    published bytes); :meth:`qdq` is the all-quantized Q/DQ graph the ranking reads (its float
    twins are compared with the quantized MatMuls)."""

    @property
    def name(self) -> str: ...

    def write(self, exclude: tuple[str, ...], out: Path) -> None: ...

    def qdq(self) -> ModelProto: ...


@dataclass(frozen=True)
class Check:
    """What a checked build measures against: the ``rule``, the dataset whose ``test`` split is the
    holdout (``data``: the calibration data), the holdout's size (``samples`` None: by the model's
    cost), how graphs run (``run``) and how many runs may go at once (``streams``: ``run`` is
    called from that many threads; the verdict does not depend on it)."""

    rule: Rule
    data: str
    run: Run
    samples: int | None = None
    streams: int = 1


@dataclass
class Verdict:
    """What the conductor decided: ``path``, the graph to publish (the candidate measured last);
    ``kept``: the nodes kept float in it (empty: everything quantized); ``record``: the manifest's
    accuracy record; ``quality``: its measurement (None: not measured)."""

    path: Path
    kept: tuple[str, ...]
    record: dict[str, Any]
    quality: Quality | None = None
    kept_weights: list[str] = field(default_factory=list)


def make_holdout(job: QuantJob, data: str, samples: int | None, run: Run, streams: int = 1) -> Holdout:
    """The holdout a quantized build of ``job`` is measured on: the calibration set itself (FP32's
    outputs from the calibration pass where it ran, ``job.reference``) when the job shares it, then
    the dataset's ``test`` split to grow into; else ``samples`` (None: by the model's cost) puzzles
    of the test split (:func:`~hrm_deploy.precision.accuracy.holdout_examples`), up to
    :func:`~hrm_deploy.precision.holdout.growth_cap` of them."""
    import numpy as np

    from hrm_deploy.data.examples import Examples
    from hrm_deploy.errors import DataError
    from hrm_deploy.precision.accuracy import holdout_examples, holdout_size

    if not job.share_holdout:
        count = samples or holdout_size(job.meta)
        cap = growth_cap(count)
        return Holdout(job.source, holdout_examples(data, job.examples, cap), run, count, cap, streams=streams)
    count = len(job.examples)
    cap = growth_cap(count)
    pool = job.examples
    try:  # puzzles to grow into while the verdict is within the noise: the test split
        more = holdout_examples(data, job.examples, cap - count)
    except DataError:  # a .npz calibration used entirely: the calibration set alone
        more = None
    if more is not None and len(more) and more.labels is not None and job.examples.labels is not None:
        pool = Examples(
            np.concatenate([job.examples.inputs, more.inputs]),
            np.concatenate([job.examples.puzzle_identifiers, more.puzzle_identifiers]),
            np.concatenate([job.examples.labels, more.labels]),
            job.examples.source,
            "",
        )
    return Holdout(job.source, pool, run, count, cap, known=job.reference, streams=streams)


def _holdout_words(job: QuantJob, holdout: Holdout) -> str:
    """Where the holdout's puzzles came from, for the manifest."""
    source = holdout.pool.source
    if job.share_holdout:
        return f"{source} (the calibration set, FP32's answers from its pass; then the test split to grow into)"
    return source + (" (examples calibration did not use)" if Path(source).is_file() else " (test split)")


# ----------------------------------------------------------------------------------------------- cost
@dataclass
class Meter:
    """The progress line of the measurements: the phase, the puzzle runs left in the measurement
    under way (FP32's and, at most, the candidate's: a failure certain early ends it), as the holdout
    grows, and their seconds at the cost per puzzle measured so far (FP32's from the calibration
    pass until measured here; a candidate's as FP32's until one ran)."""

    holdout: Holdout
    fp32_per_puzzle: float | None
    say: Callable[[str], None]
    phase: str = ""

    def per_puzzle(self) -> tuple[float | None, float | None]:
        t = self.holdout.tally
        fp32 = t.fp32_seconds / t.fp32_puzzles if t.fp32_puzzles else self.fp32_per_puzzle
        candidate = t.candidate_seconds / t.candidate_puzzles if t.candidate_puzzles else fp32
        return fp32, candidate

    def line(self) -> str:
        fp32_left, candidate_left = self.holdout.left()
        fp32, candidate = self.per_puzzle()
        left = "?" if fp32 is None or candidate is None else f"{fp32_left * fp32 + candidate_left * candidate:.0f} s"
        grow = f" (up to {self.holdout.cap} if undecided)" if self.holdout.cap > self.holdout.target else ""
        return (
            f"{self.phase}: {self.holdout.target} puzzles{grow}, {fp32_left} FP32 and up to {candidate_left} "
            f"candidate runs left, about {left} left at most"
        )

    def show(self, *_: Any) -> None:
        self.say(self.line())


def estimate_line(name: str, holdout: Holdout, fp32_per_puzzle: float | None) -> str:
    """What the verdict may need, said before measuring: the puzzles FP32 and the candidate run on
    (FP32's answers already known from calibration not counted), how far the holdout may grow, what
    a fallback may add at most, and the time at the calibration pass's measured FP32 cost per puzzle
    (a candidate counted as costly as FP32)."""
    known = 0 if holdout.known is None else len(holdout.known)
    typical = max(0, holdout.size - known) + holdout.size
    grown = max(0, holdout.cap - known) + holdout.cap
    fallback = (MAX_SCREENS + MAX_CERTIFICATIONS - 1) * holdout.cap  # screens run on at most every puzzle
    words = (
        f"{name} vs FP32: the verdict needs {typical} puzzle runs on {holdout.size} held-out puzzles"
        + (f" (FP32's answers on {known} known from calibration)" if known else "")
        + (f", {grown} if it grows to {holdout.cap}" if holdout.cap > holdout.size else "")
        + f"; a fallback adds at most {MAX_SCREENS} screens and {MAX_CERTIFICATIONS - 1} certifications"
    )
    if fp32_per_puzzle is None:
        return words + " (no time estimate: the calibration was reused from its cache)"
    return (
        f"{words}: about {typical * fp32_per_puzzle:.0f} s ({grown * fp32_per_puzzle:.0f} s grown; a fallback at most "
        f"{fallback * fp32_per_puzzle:.0f} s more) at FP32's {fp32_per_puzzle:.3g} s per puzzle, measured by calibration"
    )


# ----------------------------------------------------------------------------------------------- the conductor
@dataclass
class _Search:
    """One build's measurements: the holdout, the rule, the candidates' files and the counts."""

    job: QuantJob
    candidates: Candidates
    holdout: Holdout
    rule: Rule
    work: Path
    meter: Meter
    files: dict[int, Path] = field(default_factory=dict)
    written: int = 0  # candidate graphs written
    screens: int = 0
    certifications: int = 0
    front: list[int] = field(default_factory=list)  # the puzzles screens run, in order
    total: int = 0  # the puzzles a screen's verdict stands for (the whole holdout)

    def file(self, key: int, exclude: tuple[str, ...]) -> Path:
        """The candidate keeping ``exclude`` float, written once (``key``: its float-set size)."""
        if key not in self.files:
            path = self.work / f"candidate-{key}.onnx"
            self.candidates.write(exclude, path)
            self.files[key] = path
            self.written += 1
        return self.files[key]

    def drop(self, keep: int | None) -> None:
        """Remove every candidate file but ``keep``'s (a failed one is never published)."""
        for key in [k for k in self.files if k != keep]:
            self.files.pop(key).unlink(missing_ok=True)

    def widen(self, path: Path) -> None:
        """Add the puzzles the candidate at ``path`` ran (a failed certification) to the front."""
        have = set(self.front)
        self.front += [r for r in self.holdout.ran(path).tolist() if r not in have]
        self.total = max(self.total, self.holdout.size, max(self.front, default=-1) + 1)

    def screen_of(self, path: Path, what: str) -> tuple[Quality, bool]:
        """The candidate on the front (:attr:`front`), judged over the :attr:`total` puzzles of the
        holdout, the rest counted as FP32 answered them; whether it passes with one more lost puzzle,
        q_halt sign and halting step to spare (it stops once it cannot)."""
        self.screens += 1
        self.meter.phase = f"screen {self.screens} ({what})"
        self.holdout.tally.kind = "screens"
        rule = self.rule
        found = self.holdout.measure_rows(
            path, np.asarray(self.front, np.int64), self.total, lambda best: not rule.within(best.one_more())
        )
        passes = rule.within(found.one_more())
        log.info(
            "%s, %s (screened on the %d puzzles of the front): %s; %s",
            self.candidates.name,
            what,
            len(self.front),
            found.describe(),
            "passes with one of each to spare" if passes else "fails",
        )
        return found, passes

    def certify(self, path: Path, what: str) -> tuple[Quality, Decision]:
        """The candidate on the whole holdout (growing while undecided, stopping once its failure is certain)."""
        self.certifications += 1
        self.meter.phase = f"certifying {what}"
        self.holdout.tally.kind = "all_quantized" if self.certifications == 1 else "certifications"
        found, decided = self.holdout.decide(path, self.rule, self.holdout.size, self.holdout.cap)
        log.info("%s, %s, certified on the holdout: %s", self.candidates.name, what, found.describe())
        return found, decided

    def record(self, final: Quality, decided: Decision) -> dict[str, Any]:
        rule = self.rule
        return {
            "checked": True,
            "budget_points": rule.budget,
            "thresholds": {
                "min_argmax_agreement": rule.thresholds.min_argmax_agreement,
                "min_q_halt_sign_agreement": rule.thresholds.min_q_halt_sign_agreement,
            },
            "measured": final.as_dict(),
            "decided": decided.as_dict(),
            "kept_float": [],
            "kept_float_nodes": [],
        }


def conduct(job: QuantJob, candidates: Candidates, check: Check | None, work: Path, stages: Stages) -> Verdict:
    """Measure, fall back, and choose the graph to publish (see the module docstring); ``check``
    None: no accuracy check (``--no-accuracy-check``), the all-quantized graph as written. ``work``:
    a staging folder the candidates are written in (the published one is left there, the others
    removed). Raises ConfigError (one line, both measurements) when no candidate is within the rule."""
    if check is None:
        path = work / "candidate-0.onnx"
        candidates.write((), path)
        return Verdict(path, (), {"checked": False, "why": "--no-accuracy-check: not measured against FP32"})
    holdout = make_holdout(job, check.data, check.samples, check.run, check.streams)
    fp32_cost = job.fp32_seconds_per_puzzle
    log.info(estimate_line(candidates.name, holdout, fp32_cost))
    started = time.perf_counter()
    label = f"measuring {candidates.name} against FP32 on {holdout.size} held-out puzzles"
    with stages.stage(label + (f" (up to {holdout.cap} if undecided)" if holdout.cap > holdout.size else "")) as say:
        meter = Meter(holdout, fp32_cost, say)
        holdout.tally.on_run = meter.show
        search = _Search(job, candidates, holdout, check.rule, work, meter)
        try:
            verdict = _run(search)
        finally:
            # no cycle keeps the holdout (and the ONNX Runtime sessions its run holds) alive: a
            # session left to the garbage collector can hang a forked child that collects it
            holdout.tally.on_run = None
    tally = holdout.tally
    verdict.record["holdout"] = _holdout_words(job, holdout)
    verdict.record["cost"] = {
        "fp32_puzzle_runs": tally.fp32_puzzles,
        "candidate_puzzle_runs": tally.candidate_puzzles,
        "candidate_puzzle_runs_by_kind": dict(sorted(tally.by_kind.items())),
        "candidate_graphs_written": search.written,
        "fp32_seconds": round(tally.fp32_seconds, 3),
        "candidate_seconds": round(tally.candidate_seconds, 3),
        "measuring_seconds": round(time.perf_counter() - started, 3),
        "fp32_seconds_per_puzzle_from_calibration": fp32_cost,
        "screens": search.screens,
        "certifications": search.certifications,
    }
    if verdict.quality is not None:
        log.info(accuracy_line(candidates.name, verdict.quality, check.rule, bool(verdict.kept)))
    return verdict


def _run(search: _Search) -> Verdict:
    """Certify the all-quantized candidate (stopped once its failure is certain); outside the rule,
    the fallback."""
    everything = search.file(0, ())
    first, decided = search.certify(everything, "all quantized")
    if search.rule.within(first) and first.puzzles >= search.holdout.size:
        search.drop(0)
        return Verdict(everything, (), search.record(first, decided), first)
    return _fallback(search, first, decided)


def _fallback(search: _Search, first: Quality, first_decided: Decision) -> Verdict:
    """Keep the fewest most harmful weights float: rank once, search on screens of the front, certify
    the choice (a failed certification widens the front and moves the search to larger float sets)."""
    from hrm_deploy.precision import sensitivity

    job, rule = search.job, search.rule
    search.widen(search.files[0])  # the front: the puzzles all-quantized ran, the least sure first
    by_weight = weight_groups(job.model, job.plan.quantize)
    weights = list(by_weight)

    def exclude(kept: list[str]) -> tuple[str, ...]:
        return tuple(n for w in kept for n in by_weight[w])

    signal = sensitivity.local_errors(
        search.candidates.qdq(), job.model, by_weight, search.holdout.pool, job.source, job.meta
    )
    ranking = "each weight's own output error (one pass)"
    if not any(signal.values()):  # no Q/DQ activation to read (NVFP4): screen each weight alone quantized
        ranking = (
            "puzzles lost, cells flipped, q_halt signs and halting steps moved with only that weight quantized "
            "(one screen per weight; puzzles gained do not offset a weight's harm)"
        )

        def alone(weight: str) -> float:
            path = search.file(-1, exclude([w for w in weights if w != weight]))  # not a mix of the search
            found, _ = search.screen_of(path, f"only {weight} quantized")
            search.files.pop(-1).unlink(missing_ok=True)
            moved = 100.0 - (100.0 if found.steps_agreement is None else found.steps_agreement)
            lost = 100.0 * found.lost / max(found.puzzles, 1)
            return lost + (100.0 - found.agreement) + (100.0 - found.q_halt_agreement) + moved

        signal = {w: alone(w) for w in weights}
    order = sorted(weights, key=lambda w: -signal[w])
    search_k = Search(len(weights))
    last, screens = first, 0  # the last measurement: a screen's, or a certification's
    certified = first  # the last measurement on the whole holdout (the refusal's)
    last_k = certified_k = 0  # the layers kept float in those two
    stopped = ""
    while True:
        k = search_k.next()
        if k is not None and screens < MAX_SCREENS:
            screens += 1
            found, passes = search.screen_of(
                search.file(k, exclude(order[:k])), f"{k} of {len(weights)} weights kept float"
            )
            search_k.record(k, passes, near=rule.within(found))
            last, last_k = found, k
            continue
        if k is not None:
            stopped = f" (the fallback search stopped after {MAX_SCREENS} screens)"
        chosen = search_k.best if search_k.best is not None else search_k.near_miss()
        if chosen is not None and search.certifications >= MAX_CERTIFICATIONS:
            stopped = f" (the fallback search stopped after {MAX_CERTIFICATIONS} certifications on the whole holdout)"
        if chosen is None or search.certifications >= MAX_CERTIFICATIONS:
            break
        last, decided = search.certify(search.files[chosen], f"{chosen} of {len(weights)} weights kept float")
        certified, certified_k = last, chosen
        if rule.within(last) and last.puzzles >= search.holdout.size:
            search.drop(chosen)
            kept = order[:chosen]
            record = search.record(last, decided)
            record.update(
                all_quantized=first.as_dict(),
                all_quantized_decided=first_decided.as_dict(),
                kept_float=[{"weight": w, "node": by_weight[w][0], "nodes": len(by_weight[w])} for w in kept],
                kept_float_nodes=list(exclude(kept)),
                sensitivity={w: round(signal[w], 6) for w in order},
                fallback={
                    "ranking": ranking,
                    "search": "galloping up from one weight, then bisecting",
                    "screens": screens,
                    "screened_puzzles": len(search.front),
                    "screens_stand_for": search.total,
                    "certifications": search.certifications,
                },
            )
            return Verdict(search.files[chosen], exclude(kept), record, last, kept)
        search.widen(search.files[chosen])  # where it failed, the next screens look too
        search_k.refute(chosen)  # the screens' choice did not hold on the whole holdout
        if stopped:
            break
    search.drop(None)
    # both measurements: all quantized, and the last mix on the whole holdout (a screen's when none was
    # certified: no mix passed its screen)
    final, final_k = (certified, certified_k) if certified is not first else (last, last_k)
    raise ConfigError(refusal(search.candidates.name, first, final, final_k, rule, search_k.most()) + stopped)
