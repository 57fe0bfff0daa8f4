"""A cheap ranking of the quantized weights for the accuracy fallback: each weight's own output error.

Ranking by measurement (one whole-holdout probe per weight, everything else float) costs one
holdout pass per weight: 40 minutes and counting on a full-size Sudoku model. Here every quantized
weight MatMul of the Q/DQ graph gets a float twin reading the same (already quantized-upstream)
input before its Q and the FP32 weight; one run of that graph on a few puzzles gives each node's
relative output error ``rms(quantized - float) / rms(float)``, the error that weight's quantization
adds where it sits. A weight's signal is the largest over its nodes (every unrolled copy). The
bisection then spends whole-holdout measurements only on mixes.

Shapes: the MatMul outputs are [B, T, out] (B puzzles, T positions).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hrm_deploy.data.examples import Examples

if TYPE_CHECKING:
    from onnx import ModelProto

log = logging.getLogger(__name__)

# Puzzles of the one ranking pass (a step graph: its first ACT step): each weight's error is an RMS
# over every [B, T, out] element of each of its copies, so two puzzles already give thousands of
# samples; on the bundled model 2 and 8 puzzles rank its six most harmful weights alike.
RANK_PUZZLES = 2
# The pass runs without ONNX Runtime's graph optimizations: applying them costs more than they save
# on two puzzles (0.4 s against 0.25 s on the bundled model), and a float DequantizeLinear -> MatMul
# computes the products an integer kernel does, up to float rounding.
RANK_OPTIMIZATION = "disabled"


def _float_input(name: str, producers: dict[str, Any]) -> str | None:
    """The float tensor behind a ``QuantizeLinear -> DequantizeLinear`` activation (None when the
    input is not one: a node left float)."""
    dq = producers.get(name)
    if dq is None or dq.op_type != "DequantizeLinear":
        return None
    q = producers.get(dq.input[0])
    if q is None or q.op_type != "QuantizeLinear":
        return None
    return str(q.input[0])


def _with_float_twins(
    qdq: ModelProto, fp32: ModelProto, groups: dict[str, list[str]]
) -> tuple[Any, dict[str, list[tuple[str, str]]]]:
    """A copy of ``qdq`` where every quantized MatMul of ``groups`` has a float twin; returns it and,
    per weight, the (quantized output, float output) names to fetch."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    by_name = {n.name: n for n in graph.node}
    fp32_nodes = {n.name: n for n in fp32.graph.node}
    fp32_weights = {t.name: t for t in fp32.graph.initializer}
    pairs: dict[str, list[tuple[str, str]]] = {}
    added: set[str] = set()
    for weight, names in groups.items():
        for name in names:
            node, source = by_name.get(name), fp32_nodes.get(name)
            if node is None or source is None or node.op_type != "MatMul" or source.input[1] not in fp32_weights:
                continue  # a Gemm's bias and transposes are not worth a twin: it ranks last
            x = _float_input(node.input[0], producers)
            if x is None:
                continue
            float_weight = f"{source.input[1]}/float_twin"
            if float_weight not in added:
                tensor = onnx.TensorProto()
                tensor.CopyFrom(fp32_weights[source.input[1]])
                tensor.name = float_weight
                graph.initializer.append(tensor)
                added.add(float_weight)
            twin = f"{node.output[0]}/float_twin"
            graph.node.append(helper.make_node("MatMul", [x, float_weight], [twin], name=f"{name}/float_twin"))
            for out in (node.output[0], twin):
                graph.output.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, None))
            pairs.setdefault(weight, []).append((node.output[0], twin))
    return model, pairs


def _feeds(session: Any, examples: Examples, meta: dict[str, Any]) -> dict[str, np.ndarray]:
    """The first :data:`RANK_PUZZLES` puzzles; a step graph's first step (reset, zero carry)."""
    from hrm_deploy.contract import CARRY, RESET
    from hrm_deploy.model.families import config_from_dict

    count = min(RANK_PUZZLES, len(examples))
    feeds: dict[str, np.ndarray] = {k: np.asarray(v, np.int32) for k, v in examples.feeds(0, count).items()}
    if meta.get("mode") == "step":
        config = config_from_dict(meta["config"])
        carry = np.zeros((count, config.total_seq_len, config.hidden_size), np.float32)
        feeds.update({CARRY[0]: carry, CARRY[1]: carry, RESET: np.ones(count, bool)})
    return feeds


def local_errors(
    qdq: ModelProto,
    fp32: ModelProto,
    groups: dict[str, list[str]],
    examples: Examples,
    source: Path,
    meta: dict[str, Any],
) -> dict[str, float]:
    """Each weight group's own relative output error in the Q/DQ graph ``qdq`` (every weight
    quantized), from one run on :data:`RANK_PUZZLES` of ``examples``; ``fp32``: the FP32 graph the
    float weights come from (same node names); ``source``: its path (an external puzzle table is
    read beside it). A group with no measurable node gets 0 (it ranks last)."""
    from hrm_deploy.export.loop_body import find_loop, first_step_feeds, lift_body
    from hrm_deploy.onnx_runtime import Optimization, ort_session
    from hrm_deploy.puzzle_table import rows_session

    def tabled(session: Any) -> Any:
        return rows_session(session, source)

    body_feeds = None  # the feeds of the run: a loop graph's body's, or the graph's own
    if find_loop(qdq) is not None:  # a loop graph: its body, on the loop's first step (as a step graph's)
        count = min(RANK_PUZZLES, len(examples))
        whole = {k: np.asarray(v, np.int32) for k, v in examples.feeds(0, count).items()}
        body_feeds = first_step_feeds(fp32, whole, tabled)
        qdq, fp32 = lift_body(qdq), lift_body(fp32)
    model, pairs = _with_float_twins(qdq, fp32, groups)
    if not pairs:  # no Q/DQ activation to read (NVFP4's dynamic FP4): no signal, and no session to run
        return dict.fromkeys(groups, 0.0)
    serialized = model.SerializeToString()
    del model
    fetch = [name for weight in pairs for pair in pairs[weight] for name in pair]
    session = ort_session(serialized, provider="cpu", optimization=Optimization(RANK_OPTIMIZATION))
    if body_feeds is None:
        session = tabled(session)
        body_feeds = _feeds(session, examples, meta)
    values = dict(zip(fetch, session.run(fetch, body_feeds), strict=True))
    errors: dict[str, float] = {}
    for weight in groups:
        worst = 0.0
        for out, twin in pairs.get(weight, []):
            reference = values[twin].astype(np.float64)
            scale = float(np.sqrt(np.mean(reference**2))) or 1.0
            worst = max(worst, float(np.sqrt(np.mean((values[out] - reference) ** 2))) / scale)
        errors[weight] = worst
    log.debug("ranked %d weights by their own output error on %d puzzles", len(errors), RANK_PUZZLES)
    return errors
