"""Static slicing as ``Gather``: the pass that keeps TensorRT's network free of shape arithmetic.

After folding (:func:`hrm_deploy.export.graph.fold_constants`) the traced segment has no
batch-dependent shape chains left, yet TensorRT's ONNX parser still turned the Sudoku-size
single-step graph into 6,700 layers of which 4,117 compute INT64 shapes: 91% of them come from
its lowering of ``Slice`` (and, less, ``Split``) on an input with a dynamic batch, which
rebuilds start/size/stride vectors from the input's run-time shape (about 26 INT64 layers per
``Slice``: shape, gathers, clamps, divisions, concatenations). HRM slices only static axes with
constant bounds (rotate-half RoPE, SwiGLU's ``chunk``, the QKV split, dropping the puzzle
positions from the logits), so each slice is the same as a ``Gather`` of the constant indices
``lo..hi-1`` along that axis: by the operators' definitions the outputs are the same elements
in the same order, bit for bit. TensorRT infers a ``Gather``'s output shape itself, with no
shape layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from hrm_deploy.errors import InternalError
from hrm_deploy.export.graph import prune_dead_nodes

INDEX_PREFIX = "hrm_deploy/arange_"  # initializer names of the shared index constants
SMALL_CONSTANT = 64  # elements


@dataclass(frozen=True)
class Piece:
    """One output of a static slice: ``output`` = ``data[..., lo:hi, ...]`` along ``axis``."""

    output: str
    axis: int
    lo: int
    hi: int


def _small(tensor: onnx.TensorProto) -> bool:
    # slice bounds, split sizes and reshape targets; weights are never read for their values
    return int(np.prod(tensor.dims)) <= SMALL_CONSTANT


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer if _small(t)}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            if _small(node.attribute[0].t):
                values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Every tensor's inferred shape; a dimension is None where it is symbolic (the batch).

    Inference runs on a light copy where the weights are declared inputs of their shape: no
    weight bytes are copied, and a segment above protobuf's 2 GiB limit still works."""
    graph = model.graph
    weights = [
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in graph.initializer if not _small(t)
    ]
    light = helper.make_model(
        helper.make_graph(
            graph.node,
            graph.name,
            [*graph.input, *weights],
            graph.output,
            initializer=[t for t in graph.initializer if _small(t)],
        ),
        opset_imports=model.opset_import,
    )
    light.ir_version = model.ir_version
    inferred = onnx.shape_inference.infer_shapes(light).graph
    shapes: dict[str, tuple[int | None, ...]] = {}
    for value in (*inferred.input, *inferred.value_info, *inferred.output):
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            shapes[value.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
    for init in inferred.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


def _axis_size(node: onnx.NodeProto, axis: int, shapes) -> tuple[int, int] | None:
    """(normalized axis, its static size), or None where the rank or the size is unknown."""
    shape = shapes.get(node.input[0])
    if shape is None:
        return None
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis < len(shape) or shape[axis] is None:
        return None
    return axis, shape[axis]


def _clamp(index: int, size: int) -> int:
    # ONNX Slice with step 1: negative bounds count from the end, then both clamp to [0, size].
    index = index + size if index < 0 else index
    return min(max(index, 0), size)


def _slice_pieces(node: onnx.NodeProto, constants, shapes) -> list[Piece] | None:
    args = list(node.input[1:]) + [""] * (5 - len(node.input))
    starts, ends, axes, steps = args[:4]
    if not (starts in constants and ends in constants) or any(a and a not in constants for a in (axes, steps)):
        return None
    starts_v, ends_v = constants[starts].ravel().tolist(), constants[ends].ravel().tolist()
    axes_v = constants[axes].ravel().tolist() if axes else list(range(len(starts_v)))
    steps_v = constants[steps].ravel().tolist() if steps else [1] * len(starts_v)
    if len(starts_v) != 1 or steps_v != [1]:
        return None
    found = _axis_size(node, int(axes_v[0]), shapes)
    if found is None:
        return None
    axis, size = found
    lo, hi = _clamp(int(starts_v[0]), size), _clamp(int(ends_v[0]), size)
    return [Piece(node.output[0], axis, lo, hi)] if hi > lo else None


def _split_pieces(node: onnx.NodeProto, constants, shapes) -> list[Piece] | None:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    found = _axis_size(node, int(attrs.get("axis", 0)), shapes)
    if found is None or not all(node.output):
        return None
    axis, size = found
    if len(node.input) > 1 and node.input[1]:
        if node.input[1] not in constants:
            return None
        sizes = [int(s) for s in constants[node.input[1]].ravel().tolist()]
    elif "split" in attrs:  # opsets before 13
        sizes = [int(s) for s in attrs["split"]]
    else:  # equal parts (num_outputs from opset 18): ceil(size / n) each, the last one smaller
        count = int(attrs.get("num_outputs", len(node.output)))
        chunk = -(-size // count)
        sizes = [chunk] * (count - 1) + [size - chunk * (count - 1)]
    if len(sizes) != len(node.output) or sum(sizes) != size or min(sizes) <= 0:
        return None
    bounds = np.cumsum([0, *sizes]).tolist()
    return [Piece(out, axis, lo, hi) for out, lo, hi in zip(node.output, bounds[:-1], bounds[1:])]


def _pieces(node: onnx.NodeProto, constants, shapes) -> list[Piece] | None:
    if node.op_type == "Slice":
        return _slice_pieces(node, constants, shapes)
    if node.op_type == "Split":
        return _split_pieces(node, constants, shapes)
    return None


def _read_names(nodes: list[onnx.NodeProto]) -> set[str]:
    """Every tensor ``nodes`` read, the reads of their sub-graphs included (a loop graph's body reads
    the outer graph's weights)."""
    names: set[str] = set()
    for node in nodes:
        names.update(i for i in node.input if i)
        for attribute in node.attribute:
            for sub in [attribute.g] * attribute.HasField("g") + list(attribute.graphs):
                names |= _read_names(list(sub.node))
    return names


def slices_to_gathers(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """Replace every ``Slice``/``Split`` along a static axis with constant bounds by ``Gather``s.

    Runs on a traced piece after folding, before the unroll is assembled. Graph inputs,
    outputs and weight names are kept; a one-output slice keeps its node name. The index
    constants are INT32 (TensorRT would add an INT64 constant and a cast per use) and shared
    by all gathers of the same range. Returns (model, number of nodes rewritten).
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    constants, shapes = _constants(graph), _static_shapes(copy)
    existing = {t.name for t in graph.initializer}
    indices: dict[tuple[int, int], str] = {}

    def index_tensor(lo: int, hi: int) -> str:
        name = f"{INDEX_PREFIX}{lo}_{hi}"
        if (lo, hi) not in indices:
            if name in existing:  # a traced weight never carries this prefix
                raise InternalError(f"the traced graph already has an initializer named {name}")
            graph.initializer.append(numpy_helper.from_array(np.arange(lo, hi, dtype=np.int32), name))
            indices[(lo, hi)] = name
        return name

    nodes: list[onnx.NodeProto] = []
    rewritten = 0
    for i, node in enumerate(graph.node):
        pieces = _pieces(node, constants, shapes)
        if pieces is None:
            nodes.append(node)
            continue
        base = node.name or f"{node.op_type}_{i}"
        for k, p in enumerate(pieces):
            name = base if len(pieces) == 1 else f"{base}/gather_{k}"
            nodes.append(
                helper.make_node(
                    "Gather", [node.input[0], index_tensor(p.lo, p.hi)], [p.output], name=name, axis=p.axis
                )
            )
        rewritten += 1
    if not rewritten:
        return model, 0
    # the slices' bounds and the splits' sizes are left without readers: drop them
    kept = prune_dead_nodes(nodes, [o.name for o in graph.output])
    used = _read_names(kept) | {i.name for i in graph.input}
    initializers = [t for t in graph.initializer if t.name in used]
    del graph.node[:], graph.initializer[:]
    graph.node.extend(kept)
    graph.initializer.extend(initializers)
    return copy, rewritten
