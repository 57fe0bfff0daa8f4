"""INT8 explicit quantization in TensorRT's convention, with ONNX Runtime's maintained static
quantizer (``quantize_static``, QDQ format) doing the graph rewrite from the ranges that
:mod:`hrm_deploy.precision.calibrate` measured and cached.

TensorRT convention: symmetric int8, per-output-channel weights, per-tensor activations,
Q/DQ only on the inputs of MatMul/Gemm with a weight; biases stay float (TensorRT rejects an
int32 bias DequantizeLinear). Which nodes: :func:`~hrm_deploy.precision.calibrate.plan_nodes`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrm_deploy.export.loop_body import find_loop
from hrm_deploy.onnx_runtime import quiet_ort
from hrm_deploy.precision.calibrate import QuantPlan

if TYPE_CHECKING:
    import onnx

    from hrm_deploy.precision.job import QuantJob


def _restrict_qdq_to_matmul_inputs(path: str) -> None:
    """ORT puts one Q/DQ pair on a quantized activation and feeds the dequantized value to
    *every* consumer, so a residual Add or a Shape would see int8-rounded values. TensorRT's
    convention (and HRM's accuracy) want Q/DQ on the MatMul input only: other consumers are
    rewired to the float tensor, and pairs nobody uses any more are removed."""
    import onnx

    model = onnx.load(path)
    nodes = model.graph.node
    q_input = {n.output[0]: n.input[0] for n in nodes if n.op_type == "QuantizeLinear"}
    float_of = {
        n.output[0]: q_input[n.input[0]] for n in nodes if n.op_type == "DequantizeLinear" and n.input[0] in q_input
    }
    for node in nodes:
        if node.op_type in ("MatMul", "Gemm"):
            continue
        for i, name in enumerate(node.input):
            if name in float_of:
                node.input[i] = float_of[name]
    drop_unread_qdq(model.graph)
    onnx.save(model, path)


def drop_unread_qdq(graph: onnx.GraphProto) -> None:
    """Remove the Q/DQ nodes of ``graph`` whose outputs nobody reads (repeatedly: a Q whose only
    reader was such a DQ goes too)."""
    nodes = graph.node
    while True:
        used = {i for n in nodes for i in n.input} | {o.name for o in graph.output}
        dead = [n for n in nodes if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.output[0] not in used]
        if not dead:
            break
        for n in dead:
            nodes.remove(n)


@contextmanager
def quick_rewiring() -> Iterator[None]:
    """ONNX Runtime's quantizer points each quantized tensor's readers at its DequantizeLinear by
    visiting every input of every node (``ONNXModel.replace_input_of_all_nodes``): tensors x nodes,
    0.5 s of the bundled 8-step unroll's 0.7 s rewrite, ~32 s of a Sudoku-size 16-step unroll's
    37 s (1,568 tensors x 19,062 nodes). The same rewiring through an index of each tensor's
    readers (built once, extended with the nodes the quantizer appends, rebuilt if it removed
    some) writes the same graph, byte for byte (tested): 0.21 s and 5.3 s. ORT's own method is
    back on exit; a version without it is left as it is."""
    try:
        from onnxruntime.quantization.onnx_model import ONNXModel
    except ImportError:  # pragma: no cover - quantize_static needs the same module
        yield
        return
    original = getattr(ONNXModel, "replace_input_of_all_nodes", None)
    if original is None or not hasattr(ONNXModel, "replace_node_input"):
        yield
        return

    def readers(model: ONNXModel) -> dict[str, list[Any]]:
        """Input name -> the top-level nodes reading it (what ORT's method visits), kept current."""
        graph = model.model.graph
        state = model.__dict__.get("_readers")  # (graph, nodes indexed, index)
        fresh = state is None or state[0] is not graph or len(graph.node) < state[1]
        index: dict[str, list[Any]] = {} if fresh else state[2]
        for node in graph.node[0 if fresh else state[1] :]:
            for name in dict.fromkeys(node.input):
                index.setdefault(name, []).append(node)
        model.__dict__["_readers"] = (graph, len(graph.node), index)
        return index

    def replace_input_of_all_nodes(self: ONNXModel, old_input_name: str, new_input_name: str) -> None:
        index = readers(self)
        for node in index.pop(old_input_name, ()):
            ONNXModel.replace_node_input(node, old_input_name, new_input_name)
            index.setdefault(new_input_name, []).append(node)

    ONNXModel.replace_input_of_all_nodes = replace_input_of_all_nodes  # type: ignore[method-assign]
    try:
        yield
    finally:
        ONNXModel.replace_input_of_all_nodes = original  # type: ignore[method-assign]


def quantize_int8(
    job: QuantJob, out_path: str | Path, exclude: tuple[str, ...] = (), activations: str = "int8"
) -> QuantPlan:
    """Write the Q/DQ graph of the job's FP32 graph to ``out_path`` from the job's cached ranges
    (``exclude``: node names also kept float).

    ``activations``: ``int8`` (TensorRT's convention) or ``uint8`` (zero point 128, the U8S8
    form ONNX Runtime's CPU integer GEMMs take); both read the same symmetric ranges, so one
    cache serves both."""
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    plan, config = job.plan_for(exclude), job.quant
    method = {
        "entropy": CalibrationMethod.Entropy,
        "minmax": CalibrationMethod.MinMax,
        "percentile": CalibrationMethod.Percentile,
    }[config.method]
    extra = {
        "ActivationSymmetric": True,
        "WeightSymmetric": True,  # TensorRT: zero point 0
        "QuantizeBias": False,  # TensorRT rejects an int32 bias DequantizeLinear
        "OpTypesToExcludeOutputQuantization": ["MatMul", "Gemm"],  # Q/DQ on MatMul inputs only
    }
    with quiet_ort(), quick_rewiring():
        quantize_static(
            job.copy_model(),  # ORT reads the parsed graph (a loop graph: its body) and saves its own copy
            str(out_path),
            None,
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8,
            weight_type=QuantType.QInt8,
            nodes_to_quantize=plan.quantize,
            op_types_to_quantize=["MatMul", "Gemm"],
            calibrate_method=method,
            extra_options=extra,
            calibration_cache_path=str(job.cache),
        )
    _restrict_qdq_to_matmul_inputs(str(out_path))
    if find_loop(job.model) is not None:  # the body's Q/DQ back into the Loop, its scales outer initializers
        import onnx

        job.save(onnx.load(str(out_path)), out_path)
    return plan
