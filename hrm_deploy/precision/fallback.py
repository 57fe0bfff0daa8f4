"""The accuracy fallback's search: which weights to keep float, and in what units.

The unit is a weight group (:func:`weight_groups`: every unrolled copy of one weight's MatMul,
kept float together). The weights are ranked once by a cheap signal (the conductor's one-pass
ranking), and :class:`Bisection` finds the fewest most harmful ones whose candidate passes its
screen, in log2(weights) screens; a choice the whole holdout then refutes sends the search to
larger float sets (:meth:`Bisection.refute`). The conductor (:mod:`hrm_deploy.precision.conductor`)
drives it; the bounds are counts, never a clock, so the same build searches the same way on an
idle or a busy machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnx import ModelProto

# The search's bounds: screens of the bisection (a bisection over a Sudoku-size model's ~50 weights
# needs 6) and certifications on the whole holdout (the all-quantized graph's and the choices')
MAX_SCREENS = 12
MAX_CERTIFICATIONS = 3


def weight_groups(model: ModelProto, quantized: set[str] | list[str]) -> dict[str, list[str]]:
    """The quantized MatMul/Gemm nodes of ``model`` grouped by the weight they read (input 1): the
    unit the fallback keeps in float, every unrolled copy of one layer together."""
    from hrm_deploy.export.loop_body import quantizable_nodes

    names = set(quantized)
    groups: dict[str, list[str]] = {}
    for node in quantizable_nodes(model):
        if node.name in names:
            groups.setdefault(node.input[1], []).append(node.name)
    return groups


class Bisection:
    """The smallest k in 1 .. ``weights`` - 1 (all float is no quantized graph) whose candidate (the
    k most harmful weights kept float) passes: :meth:`next` proposes a k, :meth:`record` takes its
    screen's verdict; when :meth:`next` returns None the search has converged on :attr:`best`
    (None: no k passed)."""

    def __init__(self, weights: int):
        self.top = weights - 1
        self.low, self.high = 1, self.top
        self.best: int | None = None
        self.tried: list[int] = []

    def next(self) -> int | None:
        """The next k to screen, or None when converged."""
        return (self.low + self.high) // 2 if self.low <= self.high else None

    def record(self, k: int, passes: bool) -> None:
        self.tried.append(k)
        if passes:
            self.best, self.high = k, k - 1
        else:
            self.low = k + 1

    def refute(self, k: int) -> None:
        """``k`` passed its screen but not the whole holdout: the answer is a larger float set."""
        self.best, self.low, self.high = None, k + 1, self.top

    def most(self) -> int:
        """The largest float set tried (for the refusal's words)."""
        return max(self.tried, default=0)
