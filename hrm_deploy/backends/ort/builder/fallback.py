"""Static INT8's fallback candidates on the cpu target: the one Q/DQ graph with chosen MatMuls back
on float.

ORT's quantizer takes about a minute on a Sudoku-size model's 16-step unroll, so a build quantizes
once and every candidate of the fallback (:class:`~hrm_deploy.backends.ort.builder.static.StaticCandidates`)
is that Q/DQ graph with the chosen MatMuls put back on their float inputs (their activation's Q/DQ
pair bypassed, the FP32 export's weight restored): a graph edit of seconds, the same graph the
quantizer would write without them. The search over which to keep float is the precision
conductor's (:mod:`hrm_deploy.precision.conductor`).
"""

from __future__ import annotations

import copy
from typing import Any

from hrm_deploy.precision.int8 import drop_unread_qdq


def float_probe(qdq: Any, weights: dict[str, Any], exclude: set[str]) -> Any:
    """A copy of the Q/DQ graph ``qdq`` whose MatMul nodes in ``exclude`` read float again: the
    activation their Q/DQ pair quantized and the FP32 weight (``weights``: name -> TensorProto
    of the FP32 export, by the MatMul's original weight name). Q/DQ nodes nobody reads any more
    are dropped; the rest of the graph is unchanged. A loop graph's MatMuls are edited in its body."""
    from hrm_deploy.export.loop_body import on_graph

    return on_graph(qdq, lambda graph_model: _float_probe(graph_model, weights, exclude))


def _float_probe(qdq: Any, weights: dict[str, Any], exclude: set[str]) -> Any:
    model = copy.deepcopy(qdq)
    nodes = model.graph.node
    made = {n.output[0]: n for n in nodes if n.op_type in ("QuantizeLinear", "DequantizeLinear")}
    have = {t.name for t in model.graph.initializer}
    for node in nodes:
        if node.name not in exclude:
            continue
        for i in (0, 1):
            dq = made.get(node.input[i])
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            q = made.get(dq.input[0])
            if q is not None and q.op_type == "QuantizeLinear":  # activation: Q -> DQ -> MatMul
                node.input[i] = q.input[0]
            else:  # weight: an int8 initializer -> DQ -> MatMul
                name = weight_name(dq.input[0])
                if name not in weights:
                    raise KeyError(f"no FP32 weight {name} for {node.name}")
                if name not in have:
                    model.graph.initializer.append(weights[name])
                    have.add(name)
                node.input[i] = name
    drop_unread_qdq(model.graph)  # then the int8 weights nobody reads any more
    used = {i for n in nodes for i in n.input}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    return model


def weight_name(quantized: str) -> str:
    """The FP32 weight behind ORT's quantized initializer name (``W_quantized`` -> ``W``)."""
    return quantized.removesuffix("_quantized")
