"""Static INT8 of the ``cpu`` target: activation scales fixed at build time, within the accuracy rule.

* Ranges come from the one job preamble every quantized build shares
  (:func:`hrm_deploy.precision.job.prepare_job`: the checkpoint's own dataset by default, the same
  methods, the same cache in ``calib/``), written as Q/DQ on the inputs of the weight MatMul/Gemm
  nodes (:func:`hrm_deploy.precision.int8.quantize_int8`) with **uint8 or int8 activations**
  (the ISA's integer GEMM: builder/isa.py) and **int8 per-channel weights**; ONNX Runtime's
  optimizer turns each ``DequantizeLinear -> MatMul`` into an integer GEMM
  (``MatMulIntegerToFloat``). The scale of every activation is a constant, so each puzzle's answer
  is the same whatever its batch-mates.
* :class:`StaticCandidates` hands the precision conductor (:func:`hrm_deploy.precision.conductor.conduct`)
  the graphs it measures: the Q/DQ graph is quantized once (ORT's quantizer takes about a minute on
  a Sudoku-size model's 16-step unroll), and each candidate is it with the chosen MatMuls put back
  on float (:func:`~hrm_deploy.precision.fallback.keep_float`, a graph edit of a fraction of a
  second), then finished as the build publishes it (ORT's offline optimization, the checked
  fusions, the metadata): the graph measured is the graph written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnx import ModelProto

    from hrm_deploy.precision.job import QuantJob

log = logging.getLogger(__name__)

Finish = Callable[[Path, Path, bool], dict[str, Any]]  # (Q/DQ graph, out, quiet) -> build facts of the cpu graph at out


@dataclass
class StaticCandidates:
    """The cpu target's static INT8 candidates (:class:`~hrm_deploy.precision.conductor.Candidates`):
    ``job``'s Q/DQ graph with ``activations`` (``uint8``: U8S8, ``int8``: S8S8), written once, each
    candidate an edit of it finished by ``finish`` into the graph the build publishes; ``facts``: each
    written candidate's build facts (optimization seconds, fusions), by its float set."""

    job: QuantJob
    activations: str
    finish: Finish
    work: Path
    name: str = "static INT8"
    facts: dict[tuple[str, ...], dict[str, Any]] = field(default_factory=dict)
    _qdq: ModelProto | None = None

    def qdq(self) -> ModelProto:
        """The all-INT8 Q/DQ graph (quantized once per build)."""
        if self._qdq is None:
            import onnx

            from hrm_deploy.precision.int8 import quantize_int8

            path = self.work / "static.qdq.onnx"
            quantize_int8(self.job, path, activations=self.activations)
            self._qdq = onnx.load(str(path))
            path.unlink()
        return self._qdq

    def write(self, exclude: tuple[str, ...], out: Path) -> None:
        import onnx

        from hrm_deploy.precision.fallback import keep_float

        qdq = self.qdq()
        graph = keep_float(qdq, self.job.model, exclude) if exclude else qdq
        staged = out.with_name(out.name + ".qdq.onnx")
        onnx.save(graph, str(staged))
        del graph
        try:
            facts = self.finish(staged, out, bool(self.facts))  # the first candidate's stages are shown
        finally:
            staged.unlink(missing_ok=True)
        quantized = [n for n in self.job.plan.quantize if n not in set(exclude)]
        self.facts[exclude] = {"quantized_nodes": len(quantized), **facts}


def sink_quantize(model: Any) -> int:
    """Undo ONNX Runtime's QDQ propagation where it splits a pattern the CPU fusions read: its
    optimizer hoists the attention output's ``QuantizeLinear`` above the ``Transpose -> Reshape``
    that merges the heads (``MatMul -> Q -> Transpose -> Reshape -> integer GEMM``); this moves
    it back below them (``MatMul -> Transpose -> Reshape -> Q``). A per-tensor Q commutes with
    both exactly (same bytes out), so the rewrite changes no value. Edits ``model`` in place;
    returns how many were moved."""
    graph = model.graph
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    initializers = {t.name: t for t in graph.initializer}
    outputs = {o.name for o in graph.output}

    def only(name: str, op_type: str) -> Any:
        users = consumers.get(name, [])
        if len(users) == 1 and users[0].op_type == op_type and name not in outputs:
            return users[0]
        return None

    moved = 0
    for quant in [n for n in graph.node if n.op_type == "QuantizeLinear"]:
        scale = initializers.get(quant.input[1])
        if scale is None or len(scale.dims) > 0 and max(scale.dims) > 1:
            continue  # per-channel: does not commute with a transpose
        transpose = only(quant.output[0], "Transpose")
        reshape = only(transpose.output[0], "Reshape") if transpose is not None else None
        if reshape is None:
            continue
        quantized = reshape.output[0]
        transpose.input[0] = quant.input[0]
        transpose.output[0] = f"{quantized}/float_transposed"
        reshape.input[0] = transpose.output[0]
        reshape.output[0] = f"{quantized}/float"
        quant.input[0] = reshape.output[0]
        quant.output[0] = quantized
        graph.node.remove(quant)  # after the reshape, keeping the order topological
        graph.node.insert(list(graph.node).index(reshape) + 1, quant)
        moved += 1
    return moved
