"""NVFP4 (FP4 E2M1 with two-level scales) in the ONNX form TensorRT reads, by our own graph code.

NVFP4 = 4-bit E2M1 values (magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6), one FP8 E4M3 scale per block of
16 consecutive values along the GEMM's reduction axis K, and one float32 scale per tensor. A value
is ``e2m1 * e4m3_block_scale * tensor_scale``. Blackwell (compute capability >= 10.0) runs FP4 x FP4
GEMMs on it. The graph is what NVIDIA's Model Optimizer (ModelOpt) exports for NVFP4:

- **weights** of each planned MatMul/Gemm, as ``[N, K]`` (output channels first, K last):
  ``DequantizeLinear(block_scale: FLOAT8E4M3FN [N, K/16], tensor_scale: float32)`` -> float scales,
  then ``DequantizeLinear(FLOAT4E2M1 [N, K], those scales, axis=-1, block_size=16)``, then a
  Transpose to the MatMul's ``[K, N]``. ``tensor_scale = amax / (6 * 448)`` (the largest block
  scale then lands on E4M3's 448), ``block_scale = E4M3(block_amax / (6 * tensor_scale))``;
- **activations** (the planned node's input): ``trt::TRT_FP4DynamicQuantize(x, tensor_scale,
  axis=-1, block_size=16, scale_type=FLOAT8E4M3FN)`` -> (FP4 values, FP8 block scales), the
  block scales dequantized by the per-tensor scale, then the values by the block scales. The
  block scales are computed at run time (TensorRT's DynamicQuantize layer); only the per-tensor
  scale ``amax / (6 * 448)`` is calibrated, with amax from the INT8 calibration cache.
- opset 23 (FLOAT4E2M1 and blocked DequantizeLinear); everything else stays float32, with the same
  float islands as INT8/FP8 (:func:`~hrm_deploy.precision.calibrate.plan_nodes`).

ONNX Runtime has no FP4 kernels: :func:`simulate_on_cpu` turns the graph into one it runs with the
same numerics (the stored FP4 weights dequantized in numpy, each dynamic quantization written as
float operators), which the accuracy check and the budget fallback use.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.errors import ConfigError, InternalError
from hrm_deploy.onnx_runtime import holds_fp4
from hrm_deploy.precision.calibrate import QuantPlan, quantize_qdq
from hrm_deploy.precision.fp8 import E4M3_MAX, activation_amax, raise_opset

logger = logging.getLogger(__name__)

E2M1_MAX = 6.0  # largest E2M1 magnitude
# the 16 E2M1 codes (sign bit 3, exponent bits 2-1, mantissa bit 0) in code order
E2M1_CODES = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
BLOCK = 16  # TensorRT's NVFP4 block size (the only one it takes)
NVFP4_OPSET = 23  # FLOAT4E2M1 tensors in DequantizeLinear
NVFP4_IR = 11
TRT_DOMAIN = "trt"
DYNAMIC_QUANTIZE = "TRT_FP4DynamicQuantize"
SIM_OPSET = 19  # the simulation: float8 Q/DQ, no float4 left
_TINY = 1e-12
E4M3_SMALLEST = 2.0**-9  # smallest (subnormal) E4M3 value: block scales are clamped up to it, as ModelOpt does


def e2m1_round(x: np.ndarray) -> np.ndarray:
    """Round to the nearest E2M1 value, ties to the even code, saturating at +-6 (float32 out).

    The E2M1 grid has step 0.5 below 2, 1 in [2, 4) and 2 in [4, 6]; rounding ``|x| / step``
    half-to-even picks the even code at a tie (0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4)."""
    a = np.abs(np.asarray(x, np.float32))
    step = np.where(a < 2, np.float32(0.5), np.where(a < 4, np.float32(1), np.float32(2)))
    q = np.minimum(np.round(a / step) * step, np.float32(E2M1_MAX))
    return np.copysign(q, x).astype(np.float32)


def e4m3_round(x: np.ndarray) -> np.ndarray:
    """Round to the nearest FLOAT8E4M3FN value (ties to even), saturating at +-448 (float32 out)."""
    import ml_dtypes

    clipped = np.clip(np.asarray(x, np.float32), -E4M3_MAX, E4M3_MAX)
    return clipped.astype(ml_dtypes.float8_e4m3fn).astype(np.float32)


def tensor_scale(amax: float) -> np.float32:
    """The per-tensor (second-level) scale ``amax / (6 * 448)``."""
    return np.float32(max(float(amax), _TINY) / (E2M1_MAX * E4M3_MAX))


def quantize_blocks(x: np.ndarray, scale: np.float32) -> tuple[np.ndarray, np.ndarray]:
    """NVFP4 of ``x`` [..., K] (K a multiple of 16) with per-tensor ``scale``: (E2M1 values
    [..., K] as float32, E4M3 block scales [..., K/16] as float32). A block scale is
    ``E4M3(block_amax / (6 * scale))``, clamped into [2**-9, 448] first (never 0: an all-zero
    block gets the smallest scale and zero values), ModelOpt's rule."""
    x = np.asarray(x, np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, BLOCK)
    wanted = np.abs(blocks).max(-1) / (np.float32(E2M1_MAX) * scale)
    block_scale = e4m3_round(np.maximum(wanted, np.float32(E4M3_SMALLEST)))
    step = (block_scale * scale)[..., None]  # what DequantizeLinear(block_scale, scale) gives
    values = e2m1_round(blocks / step)
    return values.reshape(x.shape), block_scale


def fake_quantize(x: np.ndarray, scale: np.float32) -> np.ndarray:
    """Quantize-dequantize ``x`` [..., K] through NVFP4 with per-tensor ``scale`` (float32)."""
    values, block_scale = quantize_blocks(x, scale)
    step = np.repeat(block_scale * scale, BLOCK, axis=-1)
    return (values * step).astype(np.float32)


def pack_e2m1(values: np.ndarray) -> bytes:
    """ONNX FLOAT4E2M1 raw data of E2M1 ``values``: two per byte, the first in the low nibble."""
    import ml_dtypes

    codes = np.asarray(values, np.float32).astype(ml_dtypes.float4_e2m1fn).view(np.uint8).ravel() & 0x0F
    if codes.size % 2:
        codes = np.append(codes, np.uint8(0))
    return (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8).tobytes()


def unpack_e2m1(raw: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 values of FLOAT4E2M1 raw data (inverse of :func:`pack_e2m1`)."""
    packed = np.frombuffer(raw, np.uint8)
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).ravel()[: int(np.prod(shape))]
    return E2M1_CODES[codes].reshape(shape)


def _rank_of(model) -> dict[str, int]:
    """Rank of every tensor whose shape ONNX's shape inference knows."""
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(model).graph
    infos = list(inferred.value_info) + list(inferred.input) + list(inferred.output)
    return {v.name: len(v.type.tensor_type.shape.dim) for v in infos if v.type.tensor_type.HasField("shape")}


def _keep_float_where_fp4_cannot(model, plan: QuantPlan) -> None:
    """Move to ``plan.excluded`` the planned nodes TensorRT's NVFP4 cannot take: K not a multiple
    of 16, or an activation that is not 2-D or 3-D (its DynamicQuantize layer's limit)."""
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    ranks = _rank_of(model)
    planned = set(plan.quantize)
    for node in [n for n in model.graph.node if n.name in planned]:
        weight = numpy_helper.to_array(inits[node.input[1]])
        k = _as_nk(node, weight)[0].shape[-1] if weight.ndim == 2 else 0
        rank = ranks.get(node.input[0])
        why = None
        if weight.ndim != 2:
            why = f"NVFP4: the weight is {weight.ndim}-D, not a [K, N] matrix (kept in float)"
        elif k % BLOCK:
            why = f"NVFP4: reduction size {k} is not a multiple of {BLOCK} (kept in float)"
        elif rank is not None and rank not in (2, 3):
            why = f"NVFP4: TensorRT quantizes 2-D or 3-D activations dynamically, this one is {rank}-D (kept in float)"
        if why:
            plan.quantize.remove(node.name)
            plan.excluded[node.name] = why
    if not plan.quantize:
        raise ConfigError(
            f"NVFP4 can take none of this graph's MatMul/Gemm nodes ({'; '.join(sorted(set(plan.excluded.values())))}); "
            "use --fp8 or --int8"
        )


def _as_nk(node, weight: np.ndarray) -> tuple[np.ndarray, bool]:
    """The weight as [N, K] (K, the reduction axis, last) and whether the graph must transpose
    it back: a MatMul or a Gemm without transB takes [K, N]; a Gemm with transB takes [N, K]."""
    if node.op_type == "Gemm" and next((a.i for a in node.attribute if a.name == "transB"), 0):
        return weight, False
    return weight.T, True


def write_nvfp4_qdq(model, plan: QuantPlan, amax: dict[str, float]) -> None:
    """Rewrite ``model`` in place: NVFP4 weights and dynamic NVFP4 activations on every node in
    ``plan.quantize`` that FP4 can take (the others move to ``plan.excluded``); ``amax``: the
    calibrated max |x| of each activation. (One pass over the nodes, long on purpose: the maps of
    tensors already quantized are shared by the activation and the weight halves.)"""
    from onnx import TensorProto, helper, numpy_helper

    from hrm_deploy.export.graph import topological_sort

    graph = model.graph
    _keep_float_where_fp4_cannot(model, plan)
    raise_opset(model, NVFP4_OPSET, NVFP4_IR)
    if not any(o.domain == TRT_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(TRT_DOMAIN, 1))
    inits = {i.name: i for i in graph.initializer}
    planned = set(plan.quantize)
    weights: dict[str, str] = {}  # initializer -> its dequantized [K, N] or [N, K] tensor
    activations: dict[str, str] = {}  # float tensor -> its dequantized NVFP4 copy
    added = []
    for node in graph.node:
        if node.name not in planned:
            continue
        x, w = node.input[0], node.input[1]
        if x not in amax:
            raise InternalError(f"no calibrated range for {x!r}: the calibration cache does not match the graph")
        if x not in activations:
            base = f"{x}/nvfp4"
            graph.initializer.append(numpy_helper.from_array(np.array(tensor_scale(amax[x])), f"{base}/tensor_scale"))
            added += [
                helper.make_node(
                    DYNAMIC_QUANTIZE,
                    [x, f"{base}/tensor_scale"],
                    [f"{base}/e2m1", f"{base}/block_scale"],
                    name=f"{base}/{DYNAMIC_QUANTIZE}",
                    domain=TRT_DOMAIN,
                    axis=-1,
                    block_size=BLOCK,
                    scale_type=TensorProto.FLOAT8E4M3FN,
                ),
                *_dequantize(base, f"{base}/dq"),
            ]
            activations[x] = f"{base}/dq"
        if w not in weights:
            nk, transpose = _as_nk(node, numpy_helper.to_array(inits[w]).astype(np.float32))
            base = f"{w}/nvfp4"
            scale = tensor_scale(float(np.abs(nk).max()))
            values, block_scale = quantize_blocks(nk, scale)
            graph.initializer.extend(
                [
                    helper.make_tensor(f"{base}/e2m1", TensorProto.FLOAT4E2M1, nk.shape, pack_e2m1(values), raw=True),
                    helper.make_tensor(
                        f"{base}/block_scale",
                        TensorProto.FLOAT8E4M3FN,
                        block_scale.shape,
                        _e4m3_bytes(block_scale),
                        raw=True,
                    ),
                    numpy_helper.from_array(np.array(scale), f"{base}/tensor_scale"),
                ]
            )
            out = f"{base}/dq_nk" if transpose else f"{base}/dq"
            added += _dequantize(base, out)
            if transpose:
                added.append(
                    helper.make_node("Transpose", [out], [f"{base}/dq"], name=f"{base}/Transpose", perm=[1, 0])
                )
            weights[w] = f"{base}/dq"
        node.input[0], node.input[1] = activations[x], weights[w]
    graph.node.extend(added)
    used = {i for n in graph.node for i in n.input}
    for name in set(weights) - used:  # the FP4 copy replaces the float weight
        graph.initializer.remove(inits[name])
    topological_sort(graph)


def _dequantize(base: str, out: str) -> list:
    """``base``/e2m1 [.., K] (FP4) x its E4M3 block scales x the float32 tensor scale -> ``out``:
    the two-level dequantization TensorRT fuses into its FP4 GEMM (ModelOpt's form)."""
    from onnx import helper

    return [
        helper.make_node(
            "DequantizeLinear",
            [f"{base}/block_scale", f"{base}/tensor_scale"],
            [f"{base}/scale"],
            name=f"{base}/DequantizeScale",
        ),
        helper.make_node(
            "DequantizeLinear",
            [f"{base}/e2m1", f"{base}/scale"],
            [out],
            name=f"{base}/DequantizeLinear",
            axis=-1,
            block_size=BLOCK,
        ),
    ]


def _e4m3_bytes(values: np.ndarray) -> bytes:
    import ml_dtypes

    return e4m3_round(values).astype(ml_dtypes.float8_e4m3fn).view(np.uint8).tobytes()


def _write_nvfp4(model: Any, plan: QuantPlan, cache_file: Path) -> None:
    write_nvfp4_qdq(model, plan, activation_amax(cache_file))


# quantize_nvfp4(job, out_path, exclude=()): the row's writer
# the NVFP4 graph of fp32_path, its activation ranges from the cache INT8 and FP8 use
quantize_nvfp4 = partial(quantize_qdq, _write_nvfp4, "NVFP4")


def dequantize_weight(e2m1, block_scale, scale) -> np.ndarray:
    """The float32 [N, K] that ``DequantizeLinear(e2m1, DequantizeLinear(block_scale, scale),
    axis=-1, block_size=16)`` gives, from the three stored initializers (TensorProtos)."""
    import ml_dtypes
    from onnx import numpy_helper

    values = unpack_e2m1(e2m1.raw_data, tuple(e2m1.dims))
    blocks = np.frombuffer(block_scale.raw_data, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    step = blocks.reshape(tuple(block_scale.dims)) * numpy_helper.to_array(scale).astype(np.float32)
    return (values * np.repeat(step, BLOCK, axis=-1)).astype(np.float32)


def _fake_quantize_nodes(x: str, scale: np.float32, out: str, base: str) -> tuple[list, list]:
    """Float operators computing :func:`fake_quantize` of tensor ``x`` [..., K] into ``out``:
    (nodes, initializers). Same float32 operations in the same order as the numpy reference."""
    from onnx import TensorProto, helper, numpy_helper

    def const(name: str, value, dtype=np.float32):
        return numpy_helper.from_array(np.array(value, dtype), f"{base}/{name}")

    inits = [
        const("blocks_tail", [-1, BLOCK], np.int64),
        const("six_scale", np.float32(E2M1_MAX) * scale),
        const("scale", scale),
        const("smallest", E4M3_SMALLEST),
        const("one", 1.0),
        const("half", 0.5),
        const("two", 2.0),
        const("four", 4.0),
        const("six", E2M1_MAX),
        helper.make_tensor(f"{base}/fp8_zero", TensorProto.FLOAT8E4M3FN, [], b"\x00", raw=True),
    ]

    def n(op: str, inputs: list[str], name: str, **attrs):
        return helper.make_node(op, inputs, [f"{base}/{name}"], name=f"{base}/{name}", **attrs)

    inits.append(const("last_axis", [-1], np.int64))
    c = {i.name.rsplit("/", 1)[1]: i.name for i in inits}
    nodes = [
        n("Shape", [x], "shape"),
        n("Shape", [x], "lead", end=-1),
        n("Concat", [f"{base}/lead", c["blocks_tail"]], "block_shape", axis=0),
        n("Reshape", [x, f"{base}/block_shape"], "blocks"),  # [..., K/16, 16]
        n("Abs", [f"{base}/blocks"], "abs"),
        n("ReduceMax", [f"{base}/abs", c["last_axis"]], "amax", keepdims=1),
        n("Div", [f"{base}/amax", c["six_scale"]], "wanted_scale"),
        n("Max", [f"{base}/wanted_scale", c["smallest"]], "block_scale_f32"),
        n("QuantizeLinear", [f"{base}/block_scale_f32", c["one"], c["fp8_zero"]], "block_scale_e4m3"),  # saturating
        n("DequantizeLinear", [f"{base}/block_scale_e4m3", c["one"]], "block_scale"),
        n("Mul", [f"{base}/block_scale", c["scale"]], "step"),
        n("Div", [f"{base}/blocks", f"{base}/step"], "scaled"),
        n("Abs", [f"{base}/scaled"], "magnitude"),
        n("Less", [f"{base}/magnitude", c["two"]], "below_two"),
        n("Less", [f"{base}/magnitude", c["four"]], "below_four"),
        n("Where", [f"{base}/below_four", c["one"], c["two"]], "coarse_step"),
        n("Where", [f"{base}/below_two", c["half"], f"{base}/coarse_step"], "grid_step"),
        n("Div", [f"{base}/magnitude", f"{base}/grid_step"], "in_steps"),
        n("Round", [f"{base}/in_steps"], "rounded"),  # half to even
        n("Mul", [f"{base}/rounded", f"{base}/grid_step"], "on_grid"),
        n("Min", [f"{base}/on_grid", c["six"]], "saturated"),
        n("Sign", [f"{base}/scaled"], "sign"),
        n("Mul", [f"{base}/saturated", f"{base}/sign"], "e2m1"),
        n("Mul", [f"{base}/e2m1", f"{base}/step"], "dequantized"),
        helper.make_node("Reshape", [f"{base}/dequantized", f"{base}/shape"], [out], name=f"{base}/restore"),
    ]
    return nodes, inits


def simulate_on_cpu(model: Any) -> Any:
    """A copy of the NVFP4 ``model`` that ONNX Runtime's CPU provider runs with the same numerics:
    each FP4 weight (its two DequantizeLinear nodes) becomes the float32 tensor they produce, and
    each TensorRT dynamic FP4 quantization (with its two DequantizeLinear nodes) becomes float
    operators doing the same quantize-dequantize. Opset back to 19, no ``trt`` domain. A loop
    graph's FP4 nodes are in its body: that is where they are simulated."""
    import onnx

    from hrm_deploy.export.loop_body import on_graph

    def simulate(graph_model: Any) -> Any:
        sim = onnx.ModelProto()
        sim.CopyFrom(graph_model)
        _simulate_graph(sim.graph)
        return sim

    sim = on_graph(model, simulate)
    for opset in sim.opset_import:
        if opset.domain in ("", "ai.onnx"):
            opset.version = SIM_OPSET
    kept = [o for o in sim.opset_import if o.domain != TRT_DOMAIN]
    del sim.opset_import[:]
    sim.opset_import.extend(kept)
    return sim


def _simulate_graph(graph: Any) -> None:
    """:func:`simulate_on_cpu` 's rewrite of one graph, in place."""
    from onnx import numpy_helper

    from hrm_deploy.export.graph import topological_sort

    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    drop, add_nodes, add_inits = [], [], []
    for node in graph.node:
        blocked = any(a.name == "block_size" for a in node.attribute)
        if node.op_type == "DequantizeLinear" and blocked and node.input[0] in inits:
            scale_node = producer[node.input[1]]
            block_scale, scale = (inits[i] for i in scale_node.input[:2])
            weight = dequantize_weight(inits[node.input[0]], block_scale, scale)
            add_inits.append(numpy_helper.from_array(weight, node.output[0]))
            drop += [node, scale_node]
        elif node.op_type == DYNAMIC_QUANTIZE:
            x, scale_name = node.input[0], node.input[1]
            (scale_dq,) = consumers[node.output[1]]
            (values_dq,) = consumers[node.output[0]]
            scale = np.float32(numpy_helper.to_array(inits[scale_name]))  # the per-tensor scale, a scalar
            nodes, extra = _fake_quantize_nodes(x, scale, values_dq.output[0], f"{node.name}/sim")
            add_nodes += nodes
            add_inits += extra
            drop += [node, scale_dq, values_dq]
    dropped = {n.output[0] for n in drop}  # by output name: one pass, not a search per node
    kept_nodes = [n for n in graph.node if not (n.output and n.output[0] in dropped)] + add_nodes
    del graph.node[:]
    graph.node.extend(kept_nodes)
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    kept_inits = [i for i in [*graph.initializer, *add_inits] if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept_inits)
    topological_sort(graph)


@contextlib.contextmanager
def cpu_runnable(path: str | Path) -> Iterator[str]:
    """``path`` itself, or for an NVFP4 graph its :func:`simulate_on_cpu` copy (in a temporary
    folder of its own, removed afterwards): a graph ONNX Runtime's CPU provider can evaluate."""
    import tempfile

    import onnx

    model = onnx.load(str(path))
    if not holds_fp4(model):
        del model
        yield str(path)
        return
    with tempfile.TemporaryDirectory(prefix="hrm-deploy-nvfp4-sim-") as folder:
        sim_path = Path(folder) / Path(path).name
        onnx.save(simulate_on_cpu(model), str(sim_path))
        del model
        yield str(sim_path)
