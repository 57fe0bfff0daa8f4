"""FP16 and BF16 graphs from the FP32 export, with float32 islands.

The conversion itself is ONNX Runtime's maintained float16 converter
(``onnxruntime.transformers.float16``): it retypes initializers and values, rewrites
Cast targets and inserts the boundary casts around the nodes we keep in float32. We only
choose those nodes. ModelOpt AutoCast does the same job but pulls in a large dependency
tree that does not install on every target; ORT is already our numerics oracle.

Kept in float32 by default, because HRM needs them there:
- RMSNorm: the squaring, mean, +eps, sqrt, reciprocal and scale (x^2 overflows FP16 above 256,
  and the recurrence feeds every norm output into the next segment);
- Softmax (the attention probabilities) and the Q-head sigmoid.
BF16 reuses the same islands: the FP16 graph's 16-bit floats are retyped to bfloat16
(same layout decisions, wider exponent, shorter mantissa).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from hrm_deploy.export.graph import topological_sort

FLOAT32_OP_TYPES = ("Softmax", "Sigmoid")
_NORM_TAIL = ("Add", "Sqrt", "Div", "Reciprocal", "Mul")


def norm_island_nodes(graph) -> list[str]:
    """Names of the nodes of every RMSNorm: around each ReduceMean, the squaring Mul (and the
    Cast feeding it) and the chain +eps -> Sqrt -> 1/x -> scaling Mul after it."""
    producers = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    keep: list[str] = []
    for node in graph.node:
        if node.op_type != "ReduceMean":
            continue
        keep.append(node.name)
        square = producers.get(node.input[0])
        if square is not None and square.op_type in ("Mul", "Pow"):
            keep.append(square.name)
            source = producers.get(square.input[0])
            if source is not None and source.op_type == "Cast":
                keep.append(source.name)
        current = node
        for _ in range(len(_NORM_TAIL)):
            nexts = consumers.get(current.output[0], [])
            if len(nexts) != 1 or nexts[0].op_type not in _NORM_TAIL:
                break
            current = nexts[0]
            keep.append(current.name)
            if current.op_type == "Mul":
                break
    return keep


def _retype_float16_to_bfloat16(model) -> None:
    """Turn every FLOAT16 of a converted graph into BFLOAT16 (initializers re-rounded from
    their float32 values via float16, which is exact for the range FP16 kept)."""
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    for i, init in enumerate(g.initializer):
        if init.data_type == TensorProto.FLOAT16:
            values = numpy_helper.to_array(init).astype(np.float32)
            g.initializer[i].CopyFrom(
                helper.make_tensor(init.name, TensorProto.BFLOAT16, values.shape, values.flatten().tolist())
            )
    for node in g.node:
        for attr in node.attribute:
            if attr.name == "to" and attr.i == TensorProto.FLOAT16:
                attr.i = TensorProto.BFLOAT16
            if attr.name == "value" and attr.t.data_type == TensorProto.FLOAT16:
                values = numpy_helper.to_array(attr.t).astype(np.float32)
                attr.t.CopyFrom(
                    helper.make_tensor(attr.t.name, TensorProto.BFLOAT16, values.shape, values.flatten().tolist())
                )
    for value in list(g.value_info) + list(g.input) + list(g.output):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT16:
            value.type.tensor_type.elem_type = TensorProto.BFLOAT16


def _casts_into_bodies(graph) -> None:
    """Put back into a ``Loop`` body the boundary casts the converter wrote into the outer graph for
    the body's float32 islands (it inserts every cast at the top level): a node of the outer graph
    whose inputs are all made inside one body moves into that body (in place; a loop graph only)."""
    for loop in [n for n in graph.node if n.op_type == "Loop"]:
        body = next(a.g for a in loop.attribute if a.name == "body")
        made = {i.name for i in body.input} | {out for n in body.node for out in n.output}
        outer = {i.name for i in graph.input} | {t.name for t in graph.initializer}
        outer |= {out for n in graph.node for out in n.output if n is not loop}
        moved = True
        while moved:  # chains of casts move one link per pass
            moved = False
            for node in list(graph.node):
                if node is loop or not node.input or not all(i in made and i not in outer for i in node.input if i):
                    continue
                body.node.append(node)
                graph.node.remove(node)
                made.update(node.output)
                outer.difference_update(node.output)
                moved = True


def convert_half(
    model,
    dtype: str = "fp16",
    keep_io_types: bool = True,
    extra_float32_ops: Iterable[str] = (),
    extra_float32_nodes: Iterable[str] = (),
):
    """Return a 16-bit copy of an FP32 ``onnx.ModelProto`` (``dtype`` fp16 or bf16) and the
    list of node names kept in float32."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    keep_nodes = norm_island_nodes(model.graph) + list(extra_float32_nodes)
    op_block = sorted(set(DEFAULT_OP_BLOCK_LIST) | set(FLOAT32_OP_TYPES) | set(extra_float32_ops))
    converted = convert_float_to_float16(
        model,
        keep_io_types=keep_io_types,
        op_block_list=op_block,
        node_block_list=keep_nodes,
        disable_shape_infer=False,
    )
    _casts_into_bodies(converted.graph)
    topological_sort(converted.graph)
    if dtype == "bf16":
        _retype_float16_to_bfloat16(converted)
    kept = [n.name for n in model.graph.node if n.name in set(keep_nodes) or n.op_type in op_block]
    return converted, kept
