"""The loop graph's body as a standalone model, and back: what lets graph-to-graph writers that only
read ``model.graph`` (the Q/DQ writers, the cpu target's fusions) edit the segment inside a loop graph.

A loop graph (:mod:`hrm_deploy.export.loop`) has one top-level ``Loop`` node whose body is the
inlined ACT segment. The body reads values of the outer graph by name: the segment's weights and
constants (outer initializers) and the embedding's output ``x`` (an outer node's output).

* :func:`lift_body`: the body as a model of its own. Its initializers are the outer initializers
  the body reads; its inputs are the body's own (``iter``, ``cond``, the carried values) followed by
  the other outer values it reads (types and shapes from shape inference of the whole graph); its
  outputs are the body's (``cond``, the carried values, then the scanned ones). Same opsets and IR
  version, so a writer sees an ordinary graph.
* :func:`seat_body`: an edited body model put back into the ``Loop``. Initializers it added or
  changed (int8 weights, scales, zero points) go to the outer graph, which the body reads them from
  as it read the weights; outer initializers nothing reads any more are dropped; the body's inputs
  are the ``Loop``'s again. Outputs the edit appended after the body's own become extra scan
  outputs of the ``Loop`` (named by :func:`scan_name`, ``[steps run, ...]``).
* :func:`on_graph`: ``edit(model)`` applied to the graph a writer should see: the body of a loop
  graph (lifted, edited, seated), any other graph as it is.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from hrm_deploy.errors import InternalError

log = logging.getLogger(__name__)

LOOP_OP = "Loop"


def find_loop(model: Any) -> Any | None:
    """The top-level ``Loop`` node of a loop graph (None for the unrolled and step graphs)."""
    loops = [n for n in model.graph.node if n.op_type == LOOP_OP]
    if len(loops) > 1:  # export --mode loop writes one; anything else is not ours
        raise InternalError(f"{len(loops)} top-level Loop nodes; a loop graph has one")
    return loops[0] if loops else None


def loop_node(model: Any) -> Any:
    """The top-level ``Loop`` node of a loop graph (an InternalError for any other graph: our bug)."""
    loop = find_loop(model)
    if loop is None:
        raise InternalError("not a loop graph: no top-level Loop node")
    return loop


def loop_body(model: Any) -> Any:
    """The body ``GraphProto`` of a loop graph's ``Loop`` (the proto itself: edits land in ``model``)."""
    return next(a.g for a in loop_node(model).attribute if a.name == "body")


def quantizable_nodes(model: Any) -> Any:
    """The nodes a Q/DQ plan looks at: a loop graph's body (the segment), any other graph's own."""
    return loop_body(model).node if find_loop(model) is not None else model.graph.node


def scan_name(body_output: str) -> str:
    """The ``Loop`` output of a scan output :func:`seat_body` adds (one row per step run)."""
    return f"{body_output}/steps"


def _outer_reads(body: Any) -> list[str]:
    """Names the body reads but neither makes nor takes as an input (outer-scope values), in order."""
    made = {i.name for i in body.input} | {i.name for i in body.initializer}
    made |= {o for n in body.node for o in n.output}
    seen: dict[str, None] = {}
    for node in body.node:
        for name in node.input:
            if name and name not in made:
                seen.setdefault(name, None)
    return list(seen)


def lift_body(model: Any, check: bool = True) -> Any:
    """The body of ``model`` 's ``Loop`` as a standalone ONNX model (see the module text). ``model``
    is not changed; the lifted model holds copies of the weights the body reads. ``check``: run
    ONNX's checker (off for graphs holding ONNX Runtime's own operators, which it does not know)."""
    import onnx
    from onnx import helper

    body = loop_body(model)
    outer_inits = {t.name: t for t in model.graph.initializer}
    reads = _outer_reads(body)
    values = [n for n in reads if n not in outer_inits]
    types = _outer_types(model, values)
    graph = helper.make_graph(
        list(body.node),
        body.name or "loop_body",
        [*body.input, *(types[n] for n in values)],
        list(body.output),
        initializer=[*body.initializer, *(outer_inits[n] for n in reads if n in outer_inits)],
        value_info=list(body.value_info),
    )
    lifted = helper.make_model(graph, opset_imports=list(model.opset_import), producer_name=model.producer_name)
    lifted.ir_version = model.ir_version
    if check:
        onnx.checker.check_model(lifted)
    return lifted


def _outer_types(model: Any, names: list[str]) -> dict[str, Any]:
    """The value infos of the outer values ``names`` (graph inputs, or from shape inference of a
    weightless copy of ``model``: the body's own inference is not needed)."""
    import onnx

    known = {v.name: v for v in model.graph.input}
    missing = [n for n in names if n not in known]
    if missing:
        skeleton = onnx.ModelProto()
        skeleton.CopyFrom(model)
        for tensor in skeleton.graph.initializer:  # types only: no weights through inference (small shapes kept)
            if math.prod(tensor.dims) > 64:
                tensor.ClearField("raw_data")
                tensor.ClearField("float_data")
                tensor.data_location = onnx.TensorProto.DEFAULT
        inferred = onnx.shape_inference.infer_shapes(skeleton)
        known.update({v.name: v for v in inferred.graph.value_info})
    absent = [n for n in names if n not in known]
    if absent:
        raise InternalError(f"no type for the outer values {absent} the loop body reads")
    return {n: known[n] for n in names}


def seat_body(model: Any, body_model: Any, check: bool = True) -> Any:
    """``model`` with its ``Loop`` body replaced by the edited ``body_model`` (a model
    :func:`lift_body` made, then edited; see the module text). Returns a new model, checked by
    ONNX's checker where ``check`` (see :func:`lift_body`)."""
    import onnx
    from onnx import helper

    seated = onnx.ModelProto()
    seated.CopyFrom(model)
    loop = loop_node(seated)
    body = loop_body(seated)
    own = [i.name for i in body.input]
    lifted_inputs = [i.name for i in body_model.graph.input]
    if lifted_inputs[: len(own)] != own:
        raise InternalError(f"the edited body's inputs {lifted_inputs[: len(own)]} are not the Loop body's {own}")
    outputs = list(body_model.graph.output)
    names = [o.name for o in outputs]
    before = [o.name for o in body.output]
    if names[: len(before)] != before:
        raise InternalError(f"the edited body's outputs {names[: len(before)]} are not the Loop body's {before}")
    made = {o for n in body_model.graph.node for o in n.output}
    # the body's own initializers (ONNX Runtime's optimizer makes some) stay in it; the edited
    # weights and the new scales become outer initializers, read by the body from outer scope
    own_inits = {t.name for t in body.initializer}
    new_body = helper.make_graph(
        list(body_model.graph.node),
        body.name,
        list(body.input),
        outputs,
        initializer=[t for t in body_model.graph.initializer if t.name in own_inits],
        value_info=[v for v in body_model.graph.value_info if v.name in made],
    )
    body.CopyFrom(new_body)
    loop.output.extend(scan_name(n) for n in names[len(before) :])
    inits = {t.name: t for t in seated.graph.initializer}
    for tensor in body_model.graph.initializer:
        if tensor.name not in own_inits:
            inits[tensor.name] = tensor
    used = {i for n in seated.graph.node for i in n.input} | {i for n in body.node for i in n.input}
    used |= {o.name for o in seated.graph.output}
    del seated.graph.initializer[:]
    seated.graph.initializer.extend(t for name, t in inits.items() if name in used)
    _merge_opsets(seated, body_model)
    if check:
        onnx.checker.check_model(seated)
    return seated


def _merge_opsets(model: Any, other: Any) -> None:
    """Opsets the edit imported (a writer may raise the default domain's, or add one): the higher wins."""
    have = {o.domain: o for o in model.opset_import}
    for opset in other.opset_import:
        mine = have.get(opset.domain)
        if mine is None:
            model.opset_import.add(domain=opset.domain, version=opset.version)
        elif opset.version > mine.version:
            log.debug(
                "opset of domain %r raised %d -> %d by the body's edit", opset.domain, mine.version, opset.version
            )
            mine.version = opset.version
    model.ir_version = max(model.ir_version, other.ir_version)


def on_graph(model: Any, edit: Callable[[Any], Any]) -> Any:
    """``edit(graph_model) -> graph_model`` applied where a writer's nodes belong: the lifted body of
    a loop graph (then seated back into a copy of ``model``), ``model`` itself otherwise."""
    if find_loop(model) is None:
        return edit(model)
    return seat_body(model, edit(lift_body(model)))


def first_step_feeds(model: Any, feeds: dict[str, Any], wrap: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """The inputs of ``model`` 's lifted body (:func:`lift_body`) at the loop's first step for the
    whole graph's ``feeds``: ``iter`` 0, ``cond`` true, the ``Loop`` 's starting values and the outer
    values the body reads (the embedding's ``x``), from one ONNX Runtime CPU run of ``model`` that
    outputs them (``wrap``: applied to its session, e.g. an external puzzle table's rows)."""
    import numpy as np
    import onnx

    from hrm_deploy.onnx_runtime import ort_session

    loop, body = loop_node(model), loop_body(model)
    starts = {outer: own for outer, own in zip(loop.input[2:], body.input[2:])}  # Loop input -> body input
    inits = {t.name for t in model.graph.initializer}
    values = [n for n in _outer_reads(body) if n not in inits]
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {o.name for o in probe.graph.output}
    for outer, own in starts.items():
        if outer not in present:
            typed = onnx.ValueInfoProto()
            typed.CopyFrom(own)
            typed.name = outer
            probe.graph.output.append(typed)
    probe.graph.output.extend(v for n, v in _outer_types(model, values).items() if n not in present)
    session = ort_session(probe.SerializeToString(), provider="cpu")
    del probe
    session = wrap(session) if wrap is not None else session
    fetch = [*starts, *values]
    got = dict(zip(fetch, session.run(fetch, feeds), strict=True))
    out = {body.input[0].name: np.array(0, np.int64), body.input[1].name: np.array(True)}
    out.update({own.name: got[outer] for outer, own in starts.items()})
    out.update({name: got[name] for name in values})
    return out


def all_nodes(model: Any) -> list[Any]:
    """Every node of ``model``: the outer graph's, then a loop graph's body's."""
    nodes = list(model.graph.node)
    return nodes + list(loop_body(model).node) if find_loop(model) is not None else nodes
