"""The puzzles a quantized build's verdict is measured on: :class:`Holdout` runs FP32 once per
puzzle per build and a candidate only on puzzles it has not yet run (what it showed on each kept,
row by row, while its file is unchanged), and decides a verdict on as many puzzles as it needs
(:meth:`Holdout.decide`: more while the rule's verdict is not settled, up to a cap).

A candidate runs the puzzles FP32 was least sure of first (:func:`~hrm_deploy.precision.rule.fragile_order`),
and stops as soon as its failure is certain: when even the best the puzzles not yet run could do
(each agreeing with FP32, every one FP32 does not solve gained: :meth:`~hrm_deploy.precision.rule.Quality.completed`)
leaves it outside the rule. A pass still needs every puzzle of the holdout. A screen
(:meth:`Holdout.measure_rows`) runs chosen rows only, the others counted as FP32 answered them.
:class:`Tally` counts the puzzle runs, by kind, and their seconds, for the build's estimate,
progress line and record."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.data.examples import Examples
from hrm_deploy.precision.rule import CONFIDENCE_PCT, Comparison, Outputs, Quality, Rule, fragile_order

log = logging.getLogger(__name__)

GROWTH = 4  # the holdout grows to at most this many times its first size (and the data it has)

Run = Callable[[Path, Examples], Outputs]  # a graph's outputs on examples (the graph at a path)
Stop = Callable[[Quality], bool]  # given the best a measurement under way can still become: stop it?
# puzzles per run call: a failing candidate stops within this many puzzles of the one that made its
# failure certain, the progress line moves, and a grown holdout runs only new puzzles (on the bundled
# model ONNX Runtime's cost per puzzle at batch 8 is no higher than at 32 or 64)
CHUNK = 8


def _pick(examples: Examples, rows: np.ndarray) -> Examples:
    """The puzzles ``rows`` (indices) of ``examples``."""
    labels = None if examples.labels is None else examples.labels[rows]
    return Examples(examples.inputs[rows], examples.puzzle_identifiers[rows], labels, examples.source, "")


@dataclass
class Tally:
    """Puzzle runs so far (FP32 and candidates, the candidates' also by ``kind``: what the build was
    measuring when they ran) and their seconds: what the progress line, the estimate and the
    record read. ``on_run(what, puzzles, seconds)`` is called after every run call."""

    fp32_puzzles: int = 0
    fp32_seconds: float = 0.0
    candidate_puzzles: int = 0
    candidate_seconds: float = 0.0
    kind: str = "candidate"
    by_kind: dict[str, int] = field(default_factory=dict)
    on_run: Callable[[str, int, float], None] | None = None

    def add(self, fp32: bool, puzzles: int, seconds: float) -> None:
        if fp32:
            self.fp32_puzzles, self.fp32_seconds = self.fp32_puzzles + puzzles, self.fp32_seconds + seconds
        else:
            self.candidate_puzzles += puzzles
            self.candidate_seconds += seconds
            self.by_kind[self.kind] = self.by_kind.get(self.kind, 0) + puzzles
        if self.on_run is not None:
            self.on_run("fp32" if fp32 else "candidate", puzzles, seconds)


@dataclass
class Decision:
    """How a verdict was reached: the puzzles it needed, whether it settled, and where it stopped."""

    settled: bool
    puzzles: int
    cap: int
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "confidence_pct": CONFIDENCE_PCT,
            "puzzles": self.puzzles,
            "cap_puzzles": self.cap,
            "settled": self.settled,
        }
        if self.why:
            record["why"] = self.why
        return record


@dataclass
class _Rows:
    """What a graph file showed against FP32 on each pool row it ran: a
    :class:`~hrm_deploy.precision.rule.Comparison`'s per-row columns, indexed by pool row."""

    key: tuple[str, int, int, int]
    size: int
    ran: np.ndarray = field(init=False)
    order: list[int] = field(default_factory=list)  # the rows it ran, in the order it ran them
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    cells: int = 0

    def __post_init__(self) -> None:
        self.ran = np.zeros(self.size, bool)

    def store(self, rows: np.ndarray, compared: Comparison) -> None:
        self.cells = compared.cells
        for name, values in compared.rows().items():
            if name not in self.columns:
                self.columns[name] = np.zeros(self.size, values.dtype)
            self.columns[name][rows] = values
        self.ran[rows] = True
        self.order.extend(rows.tolist())


@dataclass
class Holdout:
    """Held-out puzzles (``pool``, of which the first ``size`` are the holdout a verdict must reach,
    growing up to ``cap``) and FP32's outputs on them, each puzzle run once (``known``: FP32's
    outputs on the pool's first rows, already computed: the calibration pass's where the holdout is
    the calibration set). Candidates are measured on prefixes of the pool (:meth:`measure`), the
    puzzles FP32 was least sure of first."""

    fp32: Path
    pool: Examples
    run: Run
    size: int
    cap: int
    known: Outputs | None = None
    tally: Tally = field(default_factory=Tally)
    streams: int = 1  # chunks run at once (:mod:`hrm_deploy.streams`); what is kept never depends on it
    target: int = 0  # the puzzles the measurement under way stands for (FP32 runs up to them)
    _planned: int = 0  # the candidate's puzzle runs that measurement may need
    _done: int = 0  # and those done so far
    _rows: _Rows | None = None  # the current candidate file's rows
    _orders: dict[int, np.ndarray] = field(default_factory=dict)
    # FP32 against itself on each pool row: what a row a candidate has not run counts as (its scale,
    # whether FP32 solves it, nothing moved)
    _itself: _Rows = field(init=False)

    def __post_init__(self) -> None:
        self.fp32 = Path(self.fp32)
        self.size = max(1, min(self.size, len(self.pool)))
        self.cap = max(self.size, min(self.cap, len(self.pool)))
        self._itself = _Rows(("fp32", 0, 0, 0), len(self.pool))

    # ------------------------------------------------------------------------------------------- FP32
    def _chunks(self, path: Path, rows: np.ndarray) -> Iterator[tuple[np.ndarray, Outputs, float]]:
        """The graph at ``path`` on the pool's puzzles ``rows``, :data:`CHUNK` at a time on
        :attr:`streams` streams: each chunk, its outputs and the seconds the caller waited for them
        (what the chunk cost the build), in order (:func:`~hrm_deploy.streams.in_order`)."""
        import time

        from hrm_deploy.streams import in_order

        chunks = [rows[start : start + CHUNK] for start in range(0, len(rows), CHUNK)]
        last = time.perf_counter()
        for chunk, out in in_order(lambda c: (c, self.run(path, _pick(self.pool, c))), chunks, self.streams):
            now = time.perf_counter()
            yield chunk, out, now - last
            last = time.perf_counter()  # the consumer's own work between chunks is not the run's

    def _fp32_runs(self, rows: np.ndarray) -> None:
        """FP32 on the pool's puzzles ``rows`` (the next unknown ones), chunk by chunk, kept."""
        for chunk, out, seconds in self._chunks(self.fp32, rows):
            self.known = out if self.known is None else Outputs.concat([self.known, out])
            self.tally.add(True, len(chunk), seconds)

    def reference(self, count: int) -> Outputs:
        """FP32's outputs on the first ``count`` puzzles (computing only those not yet known)."""
        known = 0 if self.known is None else len(self.known)
        if known < count:
            self._fp32_runs(np.arange(known, count))
        assert self.known is not None
        missing = np.flatnonzero(~self._itself.ran[:count])
        if len(missing):
            fp32 = self.known.take(missing)
            self._itself.store(missing, Comparison.of(fp32, fp32, self._labels(missing)))
        return self.known.head(count)

    def _labels(self, rows: np.ndarray) -> np.ndarray | None:
        return None if self.pool.labels is None else self.pool.labels[rows]

    def order(self, count: int) -> np.ndarray:
        """The first ``count`` puzzles of the pool, those FP32 was least sure of first
        (:func:`~hrm_deploy.precision.rule.fragile_order`; FP32 run on them first)."""
        if count not in self._orders:
            self._orders[count] = fragile_order(self.reference(count))
        return self._orders[count]

    def _unsolved(self, rows: np.ndarray) -> int:
        """How many of the pool's puzzles ``rows`` FP32 does not solve (0 without labels)."""
        solved = self._itself.columns.get("fp32_solved")
        return 0 if solved is None else int(len(rows) - solved[rows].sum())

    # ------------------------------------------------------------------------------------------- candidates
    def left(self) -> tuple[int, int]:
        """Puzzle runs left in the measurement under way, at most: FP32's and the candidate's."""
        known = 0 if self.known is None else len(self.known)
        return max(0, self.target - known), max(0, self._planned - self._done)

    def _file(self, path: Path) -> _Rows:
        """The rows of the candidate at ``path``, kept while its file is the same (path, inode, size,
        modification time): a screen's puzzles are not run again when the same file is certified,
        nor a prefix when the holdout grows."""
        stat = path.stat()
        key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if self._rows is None or self._rows.key != key:
            self._rows = _Rows(key, len(self.pool))
        return self._rows

    def ran(self, path: str | Path) -> np.ndarray:
        """The pool rows the candidate at ``path`` has run, in the order it ran them."""
        return np.asarray(self._file(Path(path)).order, np.int64)

    def _comparison(self, rows: _Rows, selected: np.ndarray) -> Comparison:
        """The candidate's rows ``selected`` (pool indices): those it ran as it ran them, the others
        as FP32 answered them (FP32 against itself: nothing moved, FP32's scale and answers)."""
        self.reference(int(selected.max(initial=-1)) + 1)
        ran = rows.ran[selected]
        columns: dict[str, np.ndarray] = {}
        for name, fp32 in self._itself.columns.items():
            mine = rows.columns.get(name)
            columns[name] = fp32[selected] if mine is None else np.where(ran, mine[selected], fp32[selected])
        return Comparison.from_rows(columns, rows.cells or self._itself.cells)

    def _runs(self, path: Path, rows: _Rows, wanted: np.ndarray) -> Iterator[None]:
        """Run the candidate on the puzzles of ``wanted`` (pool indices, in that order) it has not run,
        chunk by chunk, each chunk counted in the tally (and so on the progress line); yields after
        each chunk (the caller may stop there)."""
        missing = wanted[~rows.ran[wanted]]
        self._planned, self._done = len(missing), 0
        if not len(missing):
            return
        # FP32 first, on every puzzle this runs: its runs are not mixed into the candidate's
        fp32 = self.reference(int(missing.max()) + 1)
        for chunk, out, seconds in self._chunks(path, missing):
            rows.store(chunk, Comparison.of(fp32.take(chunk), out, self._labels(chunk)))
            self._done += len(chunk)
            self.tally.add(False, len(chunk), seconds)
            yield

    def measure(self, path: str | Path, count: int, stop: Stop | None = None) -> Quality:
        """The candidate at ``path`` on the first ``count`` puzzles of the pool, those FP32 was least
        sure of first (each puzzle run once per candidate file). ``stop``, asked after every run call
        with the best the measurement can still become (:meth:`~hrm_deploy.precision.rule.Quality.completed`),
        ends it early: the measurement returned then covers the puzzles run (fewer than ``count``)."""
        path, count = Path(path), min(count, len(self.pool))
        rows = self._file(path)
        self.target, self._planned, self._done = count, int((~rows.ran[:count]).sum()), 0
        order = self.order(count)
        for _ in self._runs(path, rows, order):
            if stop is not None and (best := self.best(path, count)) is not None and stop(best):
                return self._comparison(rows, np.flatnonzero(rows.ran[:count])).quality()
        return self._comparison(rows, np.arange(count)).quality()

    def best(self, path: str | Path, count: int) -> Quality | None:
        """The best the candidate at ``path`` can still show on the first ``count`` puzzles, from
        those it ran (:meth:`~hrm_deploy.precision.rule.Quality.completed`); None when it ran them all."""
        rows = self._file(Path(path))
        left = np.flatnonzero(~rows.ran[:count])
        if not len(left):
            return None
        return self._best(rows, np.arange(count), left)

    def _best(self, rows: _Rows, selected: np.ndarray, left: np.ndarray) -> Quality:
        """The best the candidate can still show on ``selected`` with the rows ``left`` not yet run:
        those counted as FP32 answered them (every check's value is then at its best, the scale
        FP32's over all of ``selected``), each FP32 does not solve gained."""
        return self._comparison(rows, selected).quality().completed(0, self._unsolved(left))

    def measure_rows(self, path: str | Path, rows: np.ndarray, total: int, stop: Stop | None = None) -> Quality:
        """The candidate at ``path`` run on the pool's puzzles ``rows`` only (indices below
        ``total``, run in that order), judged over the first ``total`` puzzles with every other puzzle
        counted as FP32 answered it: a screen. ``stop`` as in :meth:`measure` (the best completion:
        the screen's rows not yet run agreeing, those FP32 does not solve gained)."""
        path, rows = Path(path), np.asarray(rows, np.int64)
        kept = self._file(path)
        self.target, self._planned, self._done = total, int((~kept.ran[rows]).sum()), 0
        self.reference(total)
        everything = np.arange(total)
        for _ in self._runs(path, kept, rows):
            left = rows[~kept.ran[rows]]
            if stop is not None and len(left) and stop(self._best(kept, everything, left)):
                break
        return self._comparison(kept, everything).quality()

    # ------------------------------------------------------------------------------------------- verdicts
    def counts(self, reach: int, most: int) -> Iterator[int]:
        """The holdout sizes a measurement goes through: ``reach`` (the holdout), then doubling up
        to ``most`` (bounded by the pool)."""
        most = min(most, len(self.pool))
        count = min(reach, most)
        while True:
            yield count
            if count >= most:
                return
            count = min(2 * count, most)

    def decide(self, path: str | Path, rule: Rule, reach: int, most: int) -> tuple[Quality, Decision]:
        """Measure the candidate on the ``reach`` puzzles of the holdout (the least sure first), then
        on more (doubling) while its verdict is not settled, up to ``most``. A failure stops it as
        soon as it is certain (:meth:`~hrm_deploy.precision.rule.Rule.certainly_fails`: clear, before
        the last size; at ``most``, where the measured values decide, outside the rule); a pass
        counts only on every puzzle. At ``most`` the measured values decide, and the decision says so."""
        most = min(most, len(self.pool))
        found: Quality | None = None
        for count in self.counts(reach, most):
            stop = partial(rule.certainly_fails, final=count >= most)
            found = self.measure(path, count, stop)
            best = self.best(path, count)
            if best is not None:  # stopped: a failure certain on every puzzle left
                clear = rule.certainly_fails(best, final=False)
                why = f"failure certain after {found.puzzles} of {count} puzzles, those FP32 was least sure of first"
                if not clear:
                    why += " (within the noise of the most puzzles it may use: the measured values decide)"
                return found, Decision(clear, found.puzzles, most, why)
            if rule.settled(found):
                return found, Decision(True, found.puzzles, most)
            log.debug("%d puzzles do not settle the verdict yet: %s", count, found.describe())
        assert found is not None
        why = "the verdict is within the noise of the most puzzles it may use: the measured values decide"
        return found, Decision(False, found.puzzles, most, why)


def growth_cap(size: int) -> int:
    """How far a holdout that starts at ``size`` puzzles may grow."""
    return GROWTH * size
