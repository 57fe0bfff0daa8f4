"""Tracing: the two pieces every export mode is assembled from, as ONNX models.

The embedding piece (token and puzzle embeddings plus the carry at reset) and one ACT segment are
traced once with the TorchScript exporter (seconds); :mod:`hrm_deploy.export.assemble` (step and
unrolled graphs) and :mod:`hrm_deploy.export.loop` (the loop graph) build the final graph from them
with shared initializers. Tracing the whole unroll instead takes minutes (TorchScript) to over 25
minutes (dynamo) for the Sudoku-size model.
"""

from __future__ import annotations

import io
import warnings
from typing import TYPE_CHECKING

from hrm_deploy.contract import CARRY, CARRY_OUT, FEEDS, PUZZLE_ROWS, UNROLLED_INPUTS
from hrm_deploy.errors import InternalError
from hrm_deploy.export.unroll import EmbedInit, EmbedInitRows, StepCore

if TYPE_CHECKING:
    import onnx

# Puzzle-embedding tables above this are swapped for one row while tracing and put back
# into the graph afterwards (ARC's ~1M-row table would make tracing slow and huge).
TRACE_TABLE_BYTES = 64 << 20

INITIAL_CARRY = tuple(f"{name}0" for name in CARRY)  # the embed piece's outputs: the carry at reset


def _trace(module, args, input_names, output_names, opset: int) -> onnx.ModelProto:
    import onnx
    import torch

    dynamic = {name: {0: "batch"} for name in (*input_names, *output_names)}
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            module,
            args,
            buffer,  # type: ignore[arg-type]  # a file-like object works too
            dynamo=False,
            input_names=list(input_names),
            output_names=list(output_names),
            dynamic_axes=dynamic,
            opset_version=opset,
            do_constant_folding=True,
        )
    return onnx.load_from_string(buffer.getvalue())


def _swap_large_table(core):
    """Replace a large puzzle-embedding table by its first row for tracing; returns the table."""
    emb = getattr(core, "puzzle_emb", None)
    if emb is None or emb.weights.numel() * emb.weights.element_size() <= TRACE_TABLE_BYTES:
        return None
    table = emb.weights
    emb.weights = table[:1].clone()
    return table


def _restore_table(model: onnx.ModelProto, core, table) -> None:
    from onnx import numpy_helper

    core.puzzle_emb.weights = table
    for i, init in enumerate(model.graph.initializer):
        if init.name.endswith("puzzle_emb.weights"):
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(table.numpy(), init.name))
            return
    raise InternalError("could not find the puzzle-embedding table in the traced graph")


def trace_pieces(core, opset: int, fold: bool = False, folding: dict | None = None, external: bool = False):
    """Trace (embedding + init) and one ACT segment; returns their ONNX models. With ``fold``
    their shape arithmetic is folded (:func:`hrm_deploy.export.graph.fold_constants`, on the
    embedding before a large puzzle table is put back) and node counts go into ``folding``.
    With ``external`` the embedding takes the table's rows (``puzzle_emb_rows``), not ids."""
    import torch

    from hrm_deploy.export.graph import fold_constants

    folding = folding if folding is not None else {}

    cfg = core.config
    batch = 2
    inputs = torch.zeros(batch, cfg.seq_len, dtype=torch.int32)
    pids = torch.zeros(batch, dtype=torch.int32)
    table = None if external else _swap_large_table(core)
    try:
        if external:  # the table never enters the graph: its rows come in gathered
            rows = torch.zeros(batch, cfg.puzzle_emb_ndim)
            names = (FEEDS[0], PUZZLE_ROWS)
            embed = _trace(EmbedInitRows(core), (inputs, rows), names, ("x", *INITIAL_CARRY), opset)
        else:
            embed = _trace(EmbedInit(core), (inputs, pids), UNROLLED_INPUTS, ("x", *INITIAL_CARRY), opset)
    finally:
        if table is not None:
            core.puzzle_emb.weights = table
    if fold:
        embed, folding["embed"] = fold_constants(embed)
    if table is not None:
        _restore_table(embed, core, table)
    state = torch.zeros(batch, cfg.total_seq_len, cfg.hidden_size)
    step = _trace(
        StepCore(core),
        (state, state, state),
        (*CARRY, "x"),
        (*CARRY_OUT, "logits", "q_halt", "q_continue"),
        opset,
    )
    if fold:
        step, folding["segment"] = fold_constants(step)
    return embed, step
