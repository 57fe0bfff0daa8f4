"""The puzzles a quantized build's verdict is measured on: :class:`Holdout` runs FP32 once per
puzzle per build and a candidate only on puzzles it has not yet run (its outputs kept while its file
is unchanged), measures prefixes of its pool and, for a screen, chosen rows
(:meth:`Holdout.measure_rows`), and decides a verdict on as many puzzles as it needs
(:meth:`Holdout.decide`: more while the rule's verdict is not settled, up to a cap). :class:`Tally`
counts the puzzle runs and their seconds for the build's estimate and progress line."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.data.examples import Examples
from hrm_deploy.precision.rule import CONFIDENCE_PCT, Outputs, Quality, Rule, quality

log = logging.getLogger(__name__)

GROWTH = 4  # the holdout grows to at most this many times its first size (and the data it has)

Run = Callable[[Path, Examples], Outputs]  # a graph's outputs on examples (the graph at a path)
CHUNK = 32  # puzzles per run call: the progress line moves, and a grown holdout runs only new puzzles


def _pick(examples: Examples, rows: np.ndarray) -> Examples:
    """The puzzles ``rows`` (indices) of ``examples``."""
    labels = None if examples.labels is None else examples.labels[rows]
    return Examples(examples.inputs[rows], examples.puzzle_identifiers[rows], labels, examples.source, "")


@dataclass
class Tally:
    """Puzzle runs so far (FP32 and candidates) and their seconds: what the progress line and the
    estimate read. ``on_run(what, puzzles, seconds)`` is called after every run call."""

    fp32_puzzles: int = 0
    fp32_seconds: float = 0.0
    candidate_puzzles: int = 0
    candidate_seconds: float = 0.0
    on_run: Callable[[str, int, float], None] | None = None

    def add(self, fp32: bool, puzzles: int, seconds: float) -> None:
        if fp32:
            self.fp32_puzzles, self.fp32_seconds = self.fp32_puzzles + puzzles, self.fp32_seconds + seconds
        else:
            self.candidate_puzzles += puzzles
            self.candidate_seconds += seconds
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
class Holdout:
    """Held-out puzzles (``pool``, of which the first ``size`` are the holdout a verdict must reach,
    growing up to ``cap``) and FP32's outputs on them, each puzzle run once (``known``: FP32's
    outputs on the pool's first rows, already computed: the calibration pass's where the holdout is
    the calibration set). Candidates are measured on prefixes of the pool (:meth:`measure`)."""

    fp32: Path
    pool: Examples
    run: Run
    size: int
    cap: int
    known: Outputs | None = None
    tally: Tally = field(default_factory=Tally)
    target: int = 0  # the puzzles the measurement under way stands for (FP32 runs up to them)
    _planned: int = 0  # the candidate's puzzle runs that measurement needs
    _rows: int = 0  # and those done so far
    # the current candidate file's outputs, one row per puzzle it ran (keyed by the file's identity)
    _candidate: tuple[tuple[str, int, int, int], dict[int, tuple[int, int]]] | None = None
    _runs_kept: list[Outputs] = field(default_factory=list)
    _last: Outputs | None = None

    def __post_init__(self) -> None:
        self.fp32 = Path(self.fp32)
        self.size = max(1, min(self.size, len(self.pool)))
        self.cap = max(self.size, min(self.cap, len(self.pool)))

    def _runs(self, path: Path, rows: np.ndarray, fp32: bool) -> Outputs:
        """The graph at ``path`` on the pool's puzzles ``rows`` (indices, in order), chunk by chunk,
        each chunk counted in the tally (and so on the progress line)."""
        import time

        parts: list[Outputs] = []
        for start in range(0, len(rows), CHUNK):
            chunk = rows[start : start + CHUNK]
            began = time.perf_counter()
            parts.append(self.run(path, _pick(self.pool, chunk)))
            if fp32:
                self.known = parts[-1] if self.known is None else Outputs.concat([self.known, parts[-1]])
            else:
                self._rows += len(chunk)
            self.tally.add(fp32, len(chunk), time.perf_counter() - began)
        return Outputs.concat(parts)

    def left(self) -> tuple[int, int]:
        """Puzzle runs left in the measurement under way: FP32's and the candidate's."""
        known = 0 if self.known is None else len(self.known)
        return max(0, self.target - known), max(0, self._planned - self._rows)

    def reference(self, count: int) -> Outputs:
        """FP32's outputs on the first ``count`` puzzles (computing only those not yet known)."""
        known = 0 if self.known is None else len(self.known)
        if known < count:
            self._runs(self.fp32, np.arange(known, count), fp32=True)
        assert self.known is not None
        return self.known.head(count)

    def _plan(self, path: Path, rows: np.ndarray) -> np.ndarray:
        """The puzzles of ``rows`` the candidate at ``path`` has not run while its file is the same
        (path, inode, size, modification time): a screen's puzzles are not run again when the same
        file is certified, nor a prefix when the holdout grows. Sets what the progress line counts."""
        stat = path.stat()
        key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if self._candidate is None or self._candidate[0] != key:
            self._candidate, self._runs_kept = (key, {}), []
        ran = self._candidate[1]
        missing = np.array([r for r in rows.tolist() if r not in ran], np.int64)
        self._planned, self._rows = len(missing), 0
        return missing

    def _candidate_rows(self, path: Path, rows: np.ndarray, missing: np.ndarray) -> Outputs:
        """The candidate at ``path`` on the pool's puzzles ``rows``, running the ``missing`` ones."""
        assert self._candidate is not None
        ran = self._candidate[1]  # puzzle index -> (run, row within it)
        if len(missing):
            self._runs_kept.append(self._runs(path, missing, fp32=False))
            for i, row in enumerate(missing.tolist()):
                ran[row] = (len(self._runs_kept) - 1, i)
        return Outputs.concat([self._runs_kept[run].take(np.array([i])) for run, i in (ran[r] for r in rows.tolist())])

    def measure(self, path: str | Path, count: int) -> Quality:
        """The candidate at ``path`` on the first ``count`` puzzles of the pool (each puzzle run once
        per candidate file)."""
        count = min(count, len(self.pool))
        self.target, rows = count, np.arange(count)
        missing = self._plan(Path(path), rows)
        reference = self.reference(count)
        outputs = self._candidate_rows(Path(path), rows, missing)
        self._last = outputs
        labels = None if self.pool.labels is None else self.pool.labels[:count]
        return quality(reference, outputs, labels)

    def last_outputs(self) -> Outputs | None:
        """The outputs of the candidate measured last by :meth:`measure`, on the puzzles it ran."""
        return self._last

    def measure_rows(self, path: str | Path, rows: np.ndarray, total: int) -> Quality:
        """The candidate at ``path`` run on the pool's puzzles ``rows`` only (indices below ``total``),
        judged over the first ``total`` puzzles with every other puzzle counted as FP32 answered it:
        a screen, on the puzzles where another candidate differed from FP32 (:func:`differing_rows`)."""
        self.target, rows = total, np.asarray(rows, np.int64)
        missing = self._plan(Path(path), rows)
        reference = self.reference(total)
        candidate = reference.patched(rows, self._candidate_rows(Path(path), rows, missing)) if len(rows) else reference
        labels = None if self.pool.labels is None else self.pool.labels[:total]
        return quality(reference, candidate, labels)

    def counts(self, first: int, reach: int, most: int) -> Iterator[int]:
        """The prefix sizes a sequential measurement goes through: ``first``, doubling, with
        ``reach`` and ``most`` among the stops (bounded by the pool)."""
        most = min(most, len(self.pool))
        count = min(first, most)
        while True:
            yield count
            if count >= most:
                return
            bigger = min(2 * count, most)
            if count < reach < bigger:
                bigger = reach
            count = bigger

    def decide(self, path: str | Path, rule: Rule, first: int, reach: int, most: int) -> tuple[Quality, Decision]:
        """Measure the candidate on ``first`` puzzles, then on more (doubling) while its verdict is
        not settled, up to ``most``: a clear failure stops it early; a pass counts only from ``reach``
        puzzles on (the full holdout, for the graph that will be published; the first count, for a
        screen). At ``most`` the measured values decide, and the decision says so."""
        reach = min(reach, most, len(self.pool))
        for count in self.counts(first, reach, most):
            found = self.measure(path, count)
            settled = rule.settled(found)
            failing_clearly = not rule.within(found) and settled
            if failing_clearly or (count >= reach and settled):
                return found, Decision(True, found.puzzles, min(most, len(self.pool)))
            log.debug("%d puzzles do not settle the verdict yet: %s", count, found.describe())
        why = "the verdict is within the noise of the most puzzles it may use: the measured values decide"
        return found, Decision(False, found.puzzles, min(most, len(self.pool)), why)


def growth_cap(size: int) -> int:
    """How far a holdout that starts at ``size`` puzzles may grow."""
    return GROWTH * size
