"""The accuracy rule every quantized build answers to (the precision stage's INT8/FP8/NVFP4 graphs and
the cpu target's static INT8), measured on held-out puzzles against the FP32 graph.

The rule: at most ``budget`` points of exact accuracy lost (default 1) and at least
:data:`MIN_AGREEMENT_PCT` % of output cells with FP32's argmax. The loss is judged on *paired*
flips: ``lost`` = puzzles FP32 solves and the quantized graph does not, ``gained`` = the reverse;
points lost = 100 (lost - gained) / puzzles. A holdout where one puzzle is more than the budget,
or where the flips leave the verdict within the noise, cannot judge the budget, so the holdout
grows (doubling, up to :data:`GROWTH` times its first size and never past the data) until the
verdict is clear at :data:`CONFIDENCE_PCT` % one-sided confidence or the cap is reached; at the
cap the measured loss decides, and the report says so. The graph that is published is the graph
measured last: after a fallback it is measured again and checked against the same rule, and a
graph outside it is refused, never written.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.data.examples import Examples

log = logging.getLogger(__name__)

DEFAULT_BUDGET_POINTS = 1.0  # exact-accuracy points a quantized graph may lose on the holdout
MIN_AGREEMENT_PCT = 98.0  # argmax agreement with FP32 over every output cell of the holdout
CONFIDENCE_PCT = 95.0
Z = 1.645  # one-sided 95 % normal quantile
GROWTH = 4  # the holdout grows to at most this many times its first size (and the data it has)


def _slice(examples: Examples, count: int) -> Examples:
    labels = None if examples.labels is None else examples.labels[:count]
    return Examples(examples.inputs[:count], examples.puzzle_identifiers[:count], labels, examples.source, "")


def _solved(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    from hrm_deploy.metrics import solved_rows

    return np.asarray(solved_rows(logits, labels), bool)


@dataclass(frozen=True)
class Quality:
    """A quantized graph against FP32 on the holdout. ``*_exact`` in percent (None without labels);
    ``agreement`` = % of output cells whose argmax is FP32's; ``lost`` / ``gained`` = puzzles FP32
    solves and the quantized graph does not / the reverse."""

    fp32_exact: float | None
    int8_exact: float | None
    agreement: float
    puzzles: int
    lost: int = 0
    gained: int = 0

    @property
    def loss(self) -> float:
        """Exact-accuracy points lost (negative: gained; 0 without labels)."""
        if self.fp32_exact is None or self.int8_exact is None:
            return 0.0
        return self.fp32_exact - self.int8_exact

    def within(self, budget: float) -> bool:
        """The rule on what was measured."""
        return self.loss <= budget and self.agreement >= MIN_AGREEMENT_PCT

    def margin(self) -> float:
        """Half-width in points of the one-sided interval of the loss from the paired flips; one
        more discordant puzzle than seen is counted (so no flips on few puzzles is not certainty)."""
        n = max(self.puzzles, 1)
        return 100.0 * Z * math.sqrt((self.lost + self.gained + 1) / n) / math.sqrt(n)

    def settled(self, budget: float) -> bool:
        """True when the holdout resolves the budget: the loss clears it (either way) by more than
        :meth:`margin` (always, without labels: agreement over cells is judged as measured)."""
        if self.fp32_exact is None:
            return True
        return abs(self.loss - budget) > self.margin()

    def describe(self) -> str:
        """One phrase, losses and gains in words."""
        if self.fp32_exact is None or self.int8_exact is None:
            exact = ""
        else:
            points = f"{abs(self.loss):.2f} points {'lost' if self.loss > 0 else 'gained' if self.loss < 0 else 'lost'}"
            exact = (
                f"exact {self.int8_exact:.2f} % vs FP32 {self.fp32_exact:.2f} % ({points}: {self.lost} puzzles "
                f"lost, {self.gained} gained), "
            )
        return f"{exact}argmax agreement {self.agreement:.2f} % on {self.puzzles} puzzles"

    def as_dict(self, exact_key: str = "int8_exact_pct") -> dict[str, Any]:
        return {
            "fp32_exact_pct": self.fp32_exact,
            exact_key: self.int8_exact,
            "loss_points": round(self.loss, 4),
            "argmax_agreement_pct": round(self.agreement, 4),
            "holdout_puzzles": self.puzzles,
            "puzzles_lost": self.lost,
            "puzzles_gained": self.gained,
        }


Run = Callable[[Path, Examples], np.ndarray]  # final logits of the graph at a path on examples


class Holdout:
    """Held-out puzzles (``pool``, of which the first ``size`` are in use; :meth:`grow` takes more)
    and FP32's answers on them (each computed once), to measure quantized graphs with ``run``."""

    def __init__(
        self, fp32: Path, pool: Examples, run: Run, size: int | None = None, reference: np.ndarray | None = None
    ):
        self.fp32, self.pool, self.run = Path(fp32), pool, run
        self.size = min(size or len(pool), len(pool))
        # FP32's answers already known for the pool's first rows (the calibration pass's, where the
        # holdout is the calibration set): never computed again
        self._reference = np.zeros((0,), np.float32) if reference is None else np.asarray(reference, np.float32)
        # the last candidate's logits, keyed by its file's identity: measured again after the
        # holdout grew, only the new puzzles run
        self._candidate: tuple[tuple[str, int, int, int], np.ndarray] | None = None

    @property
    def examples(self) -> Examples:
        return _slice(self.pool, self.size)

    @property
    def reference(self) -> np.ndarray:
        have = len(self._reference)
        if have < self.size:
            more = self.run(self.fp32, Examples(*_parts(self.pool, have, self.size), self.pool.source, ""))
            self._reference = more if not have else np.concatenate([self._reference, more])
        return self._reference[: self.size]

    def first(self, count: int) -> Holdout:
        """The first ``count`` puzzles (FP32's answers shared, not recomputed), not growable."""
        part = Holdout(self.fp32, _slice(self.pool, min(count, self.size)), self.run)
        part._reference = self.reference[: part.size]  # (candidates are not shared: the parts measure other graphs)
        return part

    def grow(self, cap: int) -> bool:
        """Double the puzzles in use, up to ``cap`` and the pool; False when it cannot."""
        bigger = min(2 * self.size, cap, len(self.pool))
        if bigger <= self.size:
            return False
        self.size = bigger
        return True

    def measure(self, path: str | Path) -> Quality:
        from hrm_deploy.metrics import accuracy

        reference, examples = self.reference, self.examples
        logits = self._candidate_logits(Path(path))
        agreement = 100.0 * float((logits.argmax(-1) == reference.argmax(-1)).mean())
        if examples.labels is None:
            return Quality(None, None, agreement, len(examples))
        base, ours = _solved(reference, examples.labels), _solved(logits, examples.labels)
        return Quality(
            100.0 * accuracy(reference, examples.labels)["exact_accuracy"],
            100.0 * accuracy(logits, examples.labels)["exact_accuracy"],
            agreement,
            len(examples),
            int((base & ~ours).sum()),
            int((~base & ours).sum()),
        )

    def _candidate_logits(self, path: Path) -> np.ndarray:
        """The candidate's logits on the puzzles in use, reusing those of its last measurement when
        the file is the same (path, inode, size and modification time)."""
        stat = path.stat()
        key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
        have = self._candidate[1] if self._candidate is not None and self._candidate[0] == key else None
        done = 0 if have is None else min(len(have), self.size)
        if done < self.size:
            more = self.run(path, Examples(*_parts(self.pool, done, self.size), self.pool.source, ""))
            have = more if have is None or not done else np.concatenate([have[:done], more])
        assert have is not None  # size >= 1: something ran or was kept
        self._candidate = (key, have)
        return have[: self.size]

    def decide(self, path: str | Path, budget: float, cap: int) -> tuple[Quality, dict[str, Any]]:
        """Measure ``path``, growing the holdout while the verdict is within the noise (up to
        ``cap`` puzzles). Returns the last measurement and how it was decided."""
        quality = self.measure(path)
        while not quality.settled(budget) and self.grow(cap):
            log.debug("holdout grown to %d puzzles: %s", self.size, quality.describe())
            quality = self.measure(path)
        how: dict[str, Any] = {
            "confidence_pct": CONFIDENCE_PCT,
            "margin_points": round(quality.margin(), 4),
            "cap_puzzles": min(cap, len(self.pool)),
            "settled": quality.settled(budget),
        }
        if not how["settled"]:
            how["why"] = "the loss is within the noise of the largest holdout there is: the measured loss decides"
        return quality, how


def _parts(examples: Examples, start: int, stop: int) -> tuple[Any, Any, Any]:
    labels = None if examples.labels is None else examples.labels[start:stop]
    return examples.inputs[start:stop], examples.puzzle_identifiers[start:stop], labels


def growth_cap(size: int) -> int:
    """How far a holdout that starts at ``size`` puzzles may grow."""
    return GROWTH * size


def measuring(name: str, size: int, most: int) -> str:
    """The stage line of a holdout measurement (how far it may grow, when it may)."""
    grow = f" (up to {most} if undecided)" if most > size else ""
    return f"measuring {name} against FP32 on {size} held-out puzzles{grow}"


def accuracy_line(name: str, quality: Quality, budget: float, fallback: bool) -> str:
    """The one line a build prints of its published graph's accuracy."""
    measured = quality.describe().rsplit(" on ", 1)[0]
    kept = "; sensitive layers kept float" if fallback else ""
    return f"{name} vs FP32 on {quality.puzzles} held-out puzzles: {measured} (budget {budget:g} points lost{kept})"


def refusal(what: str, first: Quality, final: Quality, kept: int, budget: float) -> str:
    """The one line of a build refused by the rule after its fallback: both measurements and the
    options."""
    return (
        f"{what} is outside the accuracy budget (<= {budget:g} points lost, >= {MIN_AGREEMENT_PCT:.0f} % argmax "
        f"agreement) even with {kept} layers kept float: {final.describe()} (all quantized: {first.describe()}); "
        "nothing was written. Pass a larger --accuracy-budget, or build a float precision (--fp16, --bf16 or --fp32)"
    )
