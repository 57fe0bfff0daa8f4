"""INT8 recipes of the ``cpu`` target: weight MatMuls quantized so that ONNX Runtime's CPU runs
them as integer GEMMs. Which weights are quantized follows the TensorRT recipe's plan
(:func:`hrm_deploy.precision.calibrate.plan_nodes`: ``lm_head`` and ``q_head`` stay float).

* ``static`` (the default; :mod:`hrm_deploy.backends.ort.builder.static`): activation scales fixed at
  build time by calibration, so answers do not depend on the batch; measured against FP32 and
  kept within the accuracy budget. The two below need no data:

* ``dynamic`` (``quantize_dynamic``): int8 weights per output column, activations quantized to
  uint8 **per call, one scale for the whole tensor** (U8S8 ``MatMulInteger`` fused into
  ``DynamicQuantizeMatMul``). The fastest (Sudoku size: 1.9-2.8x FP32 at batch 1 and 8), but the
  activation scale is taken over every puzzle in the call, so a puzzle's answer can depend on the
  puzzles batched with it (bundled model: 33 of 300 puzzles answered differently in one batch than
  alone; ``benchmarks/results/cpu_int8_recipes.json``).
* ``blockwise`` (``MatMulNBitsQuantizer``, 8 bits, symmetric, ``accuracy_level`` 4): int8 weights
  in blocks along K, activations quantized to int8 **per row and block** inside ORT's
  ``MatMulNBits`` kernel: every puzzle's answer is independent of its batch. Slower than dynamic
  (Sudoku size 1.5x FP32 where dynamic is 2.4-2.8x; on the hidden-64 bundled model 0.7-0.8x FP32).
"""

from __future__ import annotations

from typing import Any

from hrm_deploy.errors import DependencyError

RECIPES = {
    "static": "uint8 activations with scales fixed by calibration, int8 weights per channel (answers "
    "independent of batching, kept within the accuracy budget; needs calibration data)",
    "dynamic": "int8 weights per channel, uint8 activations scaled per call over the whole batch (no "
    "calibration, fastest at batch > 1; a puzzle's answer can depend on the puzzles batched with it)",
    "blockwise": "int8 weights in blocks, int8 activations per row block in MatMulNBits (no calibration, "
    "answers independent of batching; slower than FP32 on small models)",
}
INTEGER_MATMULS = (
    "MatMulInteger",
    "MatMulIntegerToFloat",
    "DynamicQuantizeMatMul",
    "MatMulNBits",
    "QLinearMatMul",
    "QGemm",
)


def quantize_weights(
    src: str,
    out: str,
    recipe: str,
    hidden_size: int,
    per_channel: bool = True,
    exclude_patterns: tuple[str, ...] = ("*lm_head*", "*q_head*"),
) -> list[str]:
    """INT8 of the weight MatMuls of ``src`` by ``recipe`` (shared weights quantized once),
    written to ``out``; returns the quantized node names."""
    import onnx

    from hrm_deploy.precision.calibrate import QuantConfig, plan_nodes

    model = onnx.load(src)
    plan = plan_nodes(model, QuantConfig(exclude_patterns=exclude_patterns))
    # Only plain MatMul (Gemm has no integer kernel in ORT's weight-quantization paths).
    by_name = {n.name: n.op_type for n in model.graph.node}
    nodes = [n for n in plan.quantize if by_name[n] == "MatMul"]
    if recipe == "blockwise":
        keep_float = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.name not in nodes]
        _blockwise(model, out, nodes, keep_float, hidden_size)
    else:
        del model
        _dynamic(src, out, nodes, per_channel)
    return nodes


def _dynamic(src: str, out: str, nodes: list[str], per_channel: bool) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from hrm_deploy.onnx_runtime import quiet_ort

    with quiet_ort():
        quantize_dynamic(
            src,
            out,
            weight_type=QuantType.QInt8,
            per_channel=per_channel,
            nodes_to_quantize=nodes,
            op_types_to_quantize=["MatMul"],
            extra_options={"MatMulConstBOnly": True},
        )


def _blockwise(model: Any, out: str, nodes: list[str], keep_float: list[str], hidden_size: int) -> None:
    try:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
    except ImportError as exc:  # onnx-ir, or an onnxruntime before MatMulNBits
        raise DependencyError(
            f"the blockwise INT8 recipe needs onnxruntime's MatMulNBits quantizer ({exc}); "
            "pip install -U onnxruntime onnx-ir, or use --cpu-int8 dynamic"
        ) from None
    from hrm_deploy.onnx_runtime import quiet_ort

    # Blocks of 128 along K where the model is wide enough (Sudoku size, measured), else 32.
    block = 128 if hidden_size >= 256 else 32
    with quiet_ort():
        quantizer = MatMulNBitsQuantizer(
            model,
            bits=8,
            block_size=block,
            is_symmetric=True,
            accuracy_level=4,  # int8 activations (per row and block) and integer dot products
            nodes_to_include=nodes,
            nodes_to_exclude=keep_float,  # the quantizer also takes MatMuls outside nodes_to_include
        )
        quantizer.process()
        quantizer.model.save_model_to_file(out)
