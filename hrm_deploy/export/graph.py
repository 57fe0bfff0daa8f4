"""ONNX graph assembly and structural checks.

The exporter traces two small graphs once (embedding + init, and one ACT segment) and
builds the unrolled graph here by copying the segment's nodes ``steps`` times with
renamed intermediate tensors. Initializers are shared by all copies, so the weights
are stored once and tracing cost does not grow with the number of steps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from hrm_deploy.errors import ExportError, InternalError


@dataclass
class GraphBuilder:
    """Accumulates nodes and initializers of a graph under construction."""

    nodes: list[onnx.NodeProto]
    initializers: dict[str, TensorProto]

    @classmethod
    def empty(cls) -> GraphBuilder:
        return cls([], {})

    def add_initializers(self, tensors: Iterable[TensorProto], prefix: str) -> dict[str, str]:
        """Add a sub-graph's initializers under ``prefix``; returns old -> new names."""
        mapping = {}
        for t in tensors:
            new = prefix + t.name
            if new not in self.initializers:
                copy = TensorProto()
                copy.CopyFrom(t)
                copy.name = new
                self.initializers[new] = copy
            mapping[t.name] = new
        return mapping

    def constant(self, name: str, values: Sequence[int]) -> str:
        if name not in self.initializers:
            self.initializers[name] = helper.make_tensor(name, TensorProto.INT64, [len(values)], list(values))
        return name

    def node(self, op: str, inputs: Sequence[str], outputs: Sequence[str], name: str, **attrs) -> None:
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=name, **attrs))

    def inline(
        self, graph: onnx.GraphProto, prefix: str, inputs: Mapping[str, str], initializer_names: Mapping[str, str]
    ) -> dict[str, str]:
        """Copy ``graph``'s nodes into this graph.

        ``inputs`` maps the sub-graph's input names to tensors of this graph;
        ``initializer_names`` maps its initializers to shared names. Every other tensor
        and every node gets ``prefix``. Returns the sub-graph's output names mapped to
        their names here.
        """
        rename = dict(initializer_names)
        rename.update(inputs)

        def name_of(tensor: str) -> str:
            if not tensor:  # optional input left empty
                return tensor
            if tensor not in rename:
                rename[tensor] = prefix + tensor
            return rename[tensor]

        for src in graph.node:
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in src.attribute):
                raise ExportError(f"node {src.name} ({src.op_type}) has a sub-graph; the traced step must be flat")
            node = onnx.NodeProto()
            node.CopyFrom(src)
            node.name = prefix + (src.name or f"{src.op_type}_{len(self.nodes)}")
            node.input[:] = [name_of(t) for t in src.input]
            node.output[:] = [name_of(t) for t in src.output]
            self.nodes.append(node)
        return {o.name: name_of(o.name) for o in graph.output}


def prune_dead_nodes(nodes: list[onnx.NodeProto], outputs: Iterable[str]) -> list[onnx.NodeProto]:
    """Drop nodes none of whose outputs reach a graph output (e.g. unused per-step logits)."""
    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed.update(i for i in node.input if i)
    kept.reverse()
    return kept


def value_info(name: str, elem_type: int, shape: Sequence[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def initializer_bytes(model: onnx.ModelProto) -> int:
    total = 0
    for t in model.graph.initializer:
        if t.raw_data:
            total += len(t.raw_data)
        else:
            count = 1
            for d in t.dims:
                count *= d
            total += count * 4
    return total


def _bypass_weight_identities(model: onnx.ModelProto) -> onnx.ModelProto:
    """The TorchScript exporter reads a weight used several times (HRM reuses each layer
    H_cycles x L_cycles times per segment) through one ``Identity`` per use; a folder turns
    each into its own copy of the weight. Consumers are pointed at the initializer instead."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    inits = {t.name for t in graph.initializer}
    outputs = {o.name for o in graph.output}
    alias = {
        n.output[0]: n.input[0]
        for n in graph.node
        if n.op_type == "Identity" and n.input[0] in inits and n.output[0] not in outputs
    }
    if not alias:
        return copy
    kept = [n for n in graph.node if not (n.op_type == "Identity" and n.output[0] in alias)]
    for node in kept:
        node.input[:] = [alias.get(i, i) for i in node.input]
    del graph.node[:]
    graph.node.extend(kept)
    return copy


def share_identical_constants(model: onnx.ModelProto, keep: set[str]) -> onnx.ModelProto:
    """Point every use of a folded constant at one copy of its bytes.

    A folder evaluates each traced use of a shared tensor separately: the RoPE tables'
    ``cos.unsqueeze(-2)`` runs once per attention call, H_cycles x (L_cycles + 1) x layers
    times per TRM segment (30 for upstream's ARC recipe, each [seq, 1, head_dim] float32), and
    every result becomes its own initializer. Initializers with equal type, shape and bytes are
    merged into one; names in ``keep`` (the traced weights) are never renamed or removed.
    """
    from onnx import numpy_helper

    canonical: dict[tuple, str] = {}
    alias: dict[str, str] = {}
    # weights first, so a folded copy of a weight maps onto the weight's own name
    ordered = sorted(model.graph.initializer, key=lambda t: t.name not in keep)
    for t in ordered:
        data = t.raw_data or numpy_helper.to_array(t).tobytes()
        key = (t.data_type, tuple(t.dims), data)
        if key in canonical and t.name not in keep:
            alias[t.name] = canonical[key]
        else:
            canonical.setdefault(key, t.name)
    if not alias:
        return model
    kept = [t for t in model.graph.initializer if t.name not in alias]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    for node in model.graph.node:
        node.input[:] = [alias.get(i, i) for i in node.input]
    return model


FORBIDDEN_OPS = ("Loop", "If", "Scan")


def check_structure(
    model: onnx.ModelProto,
    expected_io: Mapping[str, Mapping[str, tuple[int, tuple]]],
    path: str | None = None,
    loop: bool = False,
) -> onnx.ModelProto:
    """Checker, shape inference, no control flow, and the documented I/O contract.

    ``expected_io`` is ``{"inputs": {name: (elem_type, shape)}, "outputs": {...}}`` where a
    string dimension means symbolic (dynamic). ``loop``: a loop graph, exactly one top-level
    ``Loop`` whose body has no control flow of its own. Returns the shape-inferred model.
    """
    try:
        onnx.checker.check_model(path if path else model, full_check=False)
    except onnx.checker.ValidationError as exc:
        raise ExportError(f"onnx.checker rejected the graph: {str(exc).splitlines()[0]}") from None
    flow = [n for n in model.graph.node if n.op_type in FORBIDDEN_OPS]
    if loop and len(flow) == 1 and flow[0].op_type == "Loop":
        body = next(a.g for a in flow[0].attribute if a.name == "body")
        flow = [n for n in body.node if n.op_type in FORBIDDEN_OPS]
    bad = sorted({n.op_type for n in flow})
    if bad:
        raise ExportError(f"the graph contains control-flow ops {bad}; the unroll must be flat for TensorRT")
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True) if not path else model
    except onnx.shape_inference.InferenceError as exc:
        raise ExportError(f"ONNX shape inference failed: {str(exc).splitlines()[0]}") from None
    for kind, values in (("inputs", inferred.graph.input), ("outputs", inferred.graph.output)):
        actual = {v.name: v for v in values}
        expected = expected_io[kind]
        if list(actual) != list(expected):
            raise ExportError(f"graph {kind} are {list(actual)}, expected {list(expected)}")
        for name, (elem_type, shape) in expected.items():
            t = actual[name].type.tensor_type
            dims = tuple(d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim)
            if (
                t.elem_type != elem_type
                or len(dims) != len(shape)
                or any(
                    (isinstance(e, int) and a != e) or (isinstance(e, str) and not isinstance(a, str))
                    for a, e in zip(dims, shape)
                )
            ):
                raise ExportError(
                    f"{kind[:-1]} {name} is {onnx.TensorProto.DataType.Name(t.elem_type)}{list(dims)}, "
                    f"expected {onnx.TensorProto.DataType.Name(elem_type)}{list(shape)}"
                )
    return inferred


def _outer_reads(node: onnx.NodeProto) -> set[str]:
    """The tensors ``node``'s sub-graphs (a ``Loop`` body) read from the enclosing graph: what they
    use and do not make themselves. The node must follow their producers like its own inputs'."""
    reads: set[str] = set()
    for attribute in node.attribute:
        if not attribute.HasField("g"):
            continue
        body = attribute.g
        made = {i.name for i in body.input} | {t.name for t in body.initializer}
        made |= {out for n in body.node for out in n.output}
        for n in body.node:
            reads |= {name for name in (*n.input, *_outer_reads(n)) if name and name not in made}
    return reads


def topological_sort(graph) -> None:
    """Reorder ``graph.node`` in place so every node follows its inputs' producers (graph
    rewriters such as ORT's float16 converter append boundary casts at the end). Kahn's
    algorithm, keeping the original order where it is already valid."""
    import heapq

    nodes = list(graph.node)
    for node in nodes:  # a loop graph's body too (the converter appends casts there as well)
        for attribute in node.attribute:
            if attribute.HasField("g"):
                topological_sort(attribute.g)
    producer = {out: i for i, node in enumerate(nodes) for out in node.output}
    waiting = [0] * len(nodes)
    users: dict[int, list[int]] = {}
    for i, node in enumerate(nodes):
        deps = {producer[name] for name in (*node.input, *_outer_reads(node)) if name in producer}
        waiting[i] = len(deps)
        for d in deps:
            users.setdefault(d, []).append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = ", ".join(nodes[i].name for i in range(len(nodes)) if waiting[i])[:200]
        raise ExportError(f"graph has a cycle around {stuck}")
    copies = []
    for i in order:
        copy = onnx.NodeProto()
        copy.CopyFrom(nodes[i])
        copies.append(copy)
    del graph.node[:]
    graph.node.extend(copies)


# onnxslim passes kept: constant folding with shape inference (the Shape/Gather/Concat
# chains left by dynamic-batch tracing fold because only the batch dimension is symbolic) and
# dead-node elimination. Pattern fusion, weight tying and common-subexpression elimination are
# skipped: they would not change the node count of HRM's segment and cost seconds.
SLIM_SKIP = ["graph_fusion", "weight_tying", "subexpression_elimination"]


def fold_constants(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """Fold the shape arithmetic out of a traced piece (the embedding or one ACT segment).

    Runs before the unroll is assembled, so folding sees one segment (~3.6k nodes for the
    Sudoku-size model, seconds) instead of the 16-step unroll (where a folder duplicates the
    shared weights). Uses onnxslim (the ``onnx`` extra); without it the graph is returned as
    traced. Graph input/output names, node names and weight initializer names are kept.
    Returns (model, {"nodes_before", "nodes_after", "folder"}).
    """
    info: dict[str, int | str | None] = {
        "nodes_before": len(model.graph.node),
        "nodes_after": len(model.graph.node),
        "folder": None,
    }
    try:
        import onnxslim
    except ImportError:
        return model, info
    import contextlib
    import io

    model = _bypass_weight_identities(model)
    weight_bytes = initializer_bytes(model)
    with contextlib.redirect_stdout(io.StringIO()):
        folded = onnxslim.slim(model, skip_optimizations=SLIM_SKIP)
    folded = share_identical_constants(folded, {t.name for t in model.graph.initializer})
    if initializer_bytes(folded) > 1.05 * weight_bytes + (1 << 20):
        # Identical constants are shared above, so growth here is a folder producing new, distinct
        # tensors from the weights: a bug of ours or of the folder, never of the checkpoint.
        raise InternalError(
            f"constant folding grew the initializers from {weight_bytes} to {initializer_bytes(folded)} bytes"
        )
    if [o.name for o in folded.graph.output] != [o.name for o in model.graph.output] or [
        i.name for i in folded.graph.input
    ] != [i.name for i in model.graph.input]:
        raise InternalError("constant folding changed the traced graph's inputs or outputs")
    folded.ir_version = model.ir_version
    info.update(nodes_after=len(folded.graph.node), folder=f"onnxslim {onnxslim.__version__}")
    return folded, info
