"""The step and unrolled graphs, assembled at ONNX level from the two traced pieces
(:mod:`hrm_deploy.export.trace`); the loop graph is :mod:`hrm_deploy.export.loop`'s.

- ``step``: one ACT segment per call; rows with ``reset`` start from the initial carry (upstream's
  ``reset_carry``), the host or device loop drives the steps and the halting;
- ``unrolled``: the segment inlined ``steps`` times, every step run, per-step Q logits concatenated
  (and per-step answers with ``step_predictions``).

Every copy of the segment shares the one set of initializers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hrm_deploy.contract import CARRY, CARRY_OUT, FEEDS, PUZZLE_ROWS, STEP_PREDICTIONS, UNROLLED_INPUTS, graph_io
from hrm_deploy.export.trace import INITIAL_CARRY

if TYPE_CHECKING:
    import onnx

    from hrm_deploy.export.graph import GraphBuilder


def io_contract(cfg, mode: str, steps: int, step_predictions: bool, external: bool = False):
    """The graph's inputs and outputs for ``mode``: ``{"inputs"|"outputs": {name: (ONNX dtype, shape)}}``
    (the contract's :func:`~hrm_deploy.contract.graph_io` in ONNX types)."""
    from onnx import TensorProto

    types = {"int32": TensorProto.INT32, "float32": TensorProto.FLOAT, "bool": TensorProto.BOOL}
    rows = cfg.puzzle_emb_ndim if external else 0  # the gathered table rows in place of the identifiers
    io = graph_io(mode, cfg.seq_len, cfg.total_seq_len, cfg.hidden_size, cfg.vocab_size, steps, step_predictions, rows)
    return {
        side: {t.name: (types[t.dtype], t.shape) for t in io if t.is_input == (side == "inputs")}
        for side in ("inputs", "outputs")
    }


def assemble(embed, step, cfg, mode: str, steps: int, step_predictions: bool, external: bool = False):
    """Build the unrolled or single-step graph from the two traced pieces (``external``: the
    embedding piece takes ``puzzle_emb_rows``); returns the ONNX model and its :func:`io_contract`."""
    from onnx import helper

    from hrm_deploy.export.graph import GraphBuilder, prune_dead_nodes, value_info

    b = GraphBuilder.empty()
    embed_names = b.add_initializers(embed.graph.initializer, "embed/")
    step_names = b.add_initializers(step.graph.initializer, "step/")
    io_spec = io_contract(cfg, mode, steps, step_predictions, external)
    feeds = (FEEDS[0], PUZZLE_ROWS) if external else UNROLLED_INPUTS
    e = b.inline(embed.graph, "embed/", {n: n for n in feeds}, embed_names)
    if mode == "step":
        _step_body(b, step.graph, step_names, e)
    else:
        _unrolled_body(b, step.graph, step_names, e, steps, step_predictions)

    nodes = prune_dead_nodes(b.nodes, list(io_spec["outputs"]))
    used = {i for n in nodes for i in n.input}
    graph = helper.make_graph(
        nodes,
        "hrm_unrolled" if mode == "unrolled" else "hrm_step",
        [value_info(n, *spec) for n, spec in io_spec["inputs"].items()],
        [value_info(n, *spec) for n, spec in io_spec["outputs"].items()],
        initializer=[t for name, t in b.initializers.items() if name in used],
    )
    model = helper.make_model(graph, opset_imports=list(step.opset_import), producer_name="hrm-deploy")
    model.ir_version = step.ir_version
    return model, io_spec


def _step_body(b: GraphBuilder, segment: onnx.GraphProto, segment_names: dict[str, str], e: dict[str, str]) -> None:
    """One segment from the carry inputs; rows with ``reset`` start from the initial carry instead
    (upstream's ``reset_carry``). ``e``: the embedding piece's outputs by name."""
    axes = b.constant("const/axes_1_2", [1, 2])
    b.node("Unsqueeze", ["reset", axes], ["reset_mask"], "reset/Unsqueeze")
    for name, initial in zip(CARRY, INITIAL_CARRY):
        b.node("Where", ["reset_mask", e[initial], name], [f"reset/{name}"], f"reset/Where_{name}")
    carry_in = {name: f"reset/{name}" for name in CARRY}
    o = b.inline(segment, "step/", {**carry_in, "x": e["x"]}, segment_names)
    rename = {
        **{name: name for name in CARRY_OUT},
        "logits": "logits",
        "q_halt": "q_halt_logits",
        "q_continue": "q_continue_logits",
    }
    for src, dst in rename.items():
        b.node("Identity", [o[src]], [dst], f"output/{dst}")


def _unrolled_body(
    b: GraphBuilder,
    segment: onnx.GraphProto,
    segment_names: dict[str, str],
    e: dict[str, str],
    steps: int,
    step_predictions: bool,
) -> None:
    """``steps`` copies of the segment from the initial carry: the last step's logits, every step's
    Q logits as columns [B, steps] (and every step's answer [B, steps, S] with ``step_predictions``)."""
    from onnx import TensorProto

    axis1 = b.constant("const/axes_1", [1])
    z_H, z_L = (e[name] for name in INITIAL_CARRY)
    per_step: dict[str, list[str]] = {"q_halt": [], "q_continue": [], "pred": []}
    for i in range(steps):
        o = b.inline(segment, f"step{i}/", {CARRY[0]: z_H, CARRY[1]: z_L, "x": e["x"]}, segment_names)
        z_H, z_L = (o[name] for name in CARRY_OUT)
        for key in ("q_halt", "q_continue"):
            b.node("Unsqueeze", [o[key], axis1], [f"step{i}/{key}_col"], f"step{i}/{key}_Unsqueeze")
            per_step[key].append(f"step{i}/{key}_col")
        if step_predictions:
            b.node("ArgMax", [o["logits"]], [f"step{i}/argmax"], f"step{i}/ArgMax", axis=-1, keepdims=0)
            b.node("Cast", [f"step{i}/argmax"], [f"step{i}/pred"], f"step{i}/Cast_pred", to=TensorProto.INT32)
            b.node("Unsqueeze", [f"step{i}/pred", axis1], [f"step{i}/pred_row"], f"step{i}/pred_Unsqueeze")
            per_step["pred"].append(f"step{i}/pred_row")
    b.node("Identity", [o["logits"]], ["logits"], "output/logits")
    b.node("Concat", per_step["q_halt"], ["q_halt_logits"], "output/q_halt_logits", axis=1)
    b.node("Concat", per_step["q_continue"], ["q_continue_logits"], "output/q_continue_logits", axis=1)
    if step_predictions:
        b.node("Concat", per_step["pred"], [STEP_PREDICTIONS], f"output/{STEP_PREDICTIONS}", axis=1)
