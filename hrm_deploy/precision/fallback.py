"""The accuracy fallback's search: which weights to keep float, and in what units.

The unit is a weight group (:func:`weight_groups`: every unrolled copy of one weight's MatMul,
kept float together). The weights are ranked once by a cheap signal (the conductor's one-pass
ranking), and :class:`Search` finds the fewest most harmful ones whose candidate passes its
screen: galloping up from one (1, 2, 4, ...: a model usually needs few, each screen that fails
stops early), then bisecting below the first that passes, in about 2 log2(k) screens for an answer
of k weights; a choice the whole holdout then refutes sends the search to larger float sets
(:meth:`Search.refute`). The conductor (:mod:`hrm_deploy.precision.conductor`) drives it; the
bounds are counts, never a clock, so the same build searches the same way on an idle or a busy
machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnx import ModelProto

# The search's bounds: screens (an answer of k weights needs about 2 log2(k) + 1) and certifications
# on the whole holdout (the all-quantized graph's and the choices')
MAX_SCREENS = 12
MAX_CERTIFICATIONS = 4


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


def keep_float(qdq: ModelProto, fp32: ModelProto, exclude: set[str] | tuple[str, ...]) -> ModelProto:
    """A copy of the quantized graph ``qdq`` whose nodes ``exclude`` read float again: each takes the
    inputs its namesake in the FP32 graph ``fp32`` takes (the activation before its quantization,
    the FP32 weight), and the nodes and initializers only they read (their Q/DQ, the quantized
    weight) are dropped; the rest of the graph is unchanged. Any Q/DQ writer's graph (every one
    keeps the FP32 graph's node names), so the fallback's candidates are one graph edit of the
    all-quantized graph, never another quantization. A loop graph's nodes are edited in its body."""
    from hrm_deploy.export.loop_body import find_loop, lift_body, on_graph

    source = lift_body(fp32) if find_loop(fp32) is not None else fp32
    return on_graph(qdq, lambda graph_model: _keep_float(graph_model, source, set(exclude)))


def _keep_float(qdq: ModelProto, fp32: ModelProto, exclude: set[str]) -> ModelProto:
    from collections import Counter

    import onnx

    from hrm_deploy.errors import InternalError

    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    graph = model.graph
    sources = {n.name: n for n in fp32.graph.node if n.name in exclude}
    weights = {t.name: t for t in fp32.graph.initializer}
    have = {t.name for t in graph.initializer}
    dropped: list[str] = []  # tensors an edited node no longer reads
    for node in graph.node:
        if node.name not in exclude:
            continue
        source = sources.get(node.name)
        if source is None or len(source.input) != len(node.input):
            raise InternalError(f"{node.name} of the quantized graph has no namesake in the FP32 graph")
        for i, name in enumerate(source.input):
            if node.input[i] == name:
                continue
            dropped.append(node.input[i])
            node.input[i] = name
            if name in weights and name not in have:
                graph.initializer.append(weights[name])
                have.add(name)
    producers = {o: n for n in graph.node for o in n.output}
    readers = Counter(i for n in graph.node for i in n.input) + Counter(o.name for o in graph.output)
    gone: set[str] = set()  # the removed nodes, by their first output (single assignment: unique)
    while dropped:  # the nodes only the edited nodes read, and theirs, in turn
        node = producers.get(dropped.pop())
        if node is None or node.output[0] in gone or any(readers[o] for o in node.output):
            continue
        gone.add(node.output[0])
        readers.subtract(node.input)
        dropped.extend(node.input)
    if gone:
        kept = [n for n in graph.node if n.output[0] not in gone]
        del graph.node[:]
        graph.node.extend(kept)
    keep = [t for t in graph.initializer if readers[t.name] > 0]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    return model


class Search:
    """The smallest k in 1 .. ``weights`` - 1 (all float is no quantized graph) whose candidate (the
    k most harmful weights kept float) passes: :meth:`next` proposes a k, :meth:`record` takes its
    screen's verdict; when :meth:`next` returns None the search has converged on :attr:`best`
    (None: no k passed). It gallops up (the lowest k not yet excluded, then doubling) until a screen
    passes, then bisects between the last failure and that pass. A screen that is within the rule
    but not with a failure to spare is a *near miss*: when no k passes, the smallest near miss above
    every refuted k is the choice to certify (:meth:`near_miss`), so a refusal rests on the whole
    holdout, not on a screen's margin."""

    def __init__(self, weights: int):
        self.top = weights - 1
        self.low, self.high = 1, self.top
        self.best: int | None = None
        self.galloping = True
        self.tried: list[int] = []
        self.near: list[int] = []
        self.refuted = 0  # the largest k the whole holdout refuted

    def next(self) -> int | None:
        """The next k to screen, or None when converged."""
        if self.low > self.high:
            return None
        if self.galloping:  # 1, 2, 4, 8, ...; after a refuted k, 2 k
            return min(max(self.low, 2 * (self.low - 1)), self.high)
        return (self.low + self.high) // 2

    def record(self, k: int, passes: bool, near: bool = False) -> None:
        """``k``'s screen: it passes (with a failure to spare), or else is ``near`` (within the rule)."""
        self.tried.append(k)
        if near and not passes:
            self.near.append(k)
        if passes:
            self.best, self.high, self.galloping = k, k - 1, False
        else:
            self.low = k + 1

    def refute(self, k: int) -> None:
        """``k`` passed its screen but not the whole holdout: the answer is a larger float set."""
        self.best, self.low, self.high, self.galloping = None, k + 1, self.top, True
        self.refuted = max(self.refuted, k)

    def near_miss(self) -> int | None:
        """The smallest near miss above every refuted k (None: none)."""
        return min((k for k in self.near if k > self.refuted), default=None)

    def most(self) -> int:
        """The largest float set tried (for the refusal's words)."""
        return max(self.tried, default=0)
