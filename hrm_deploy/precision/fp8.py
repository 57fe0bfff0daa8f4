"""FP8 (E4M3) explicit quantization in TensorRT's convention, written by our own graph code.

What the graph holds (what TensorRT / TensorRT-RTX read as FP8 GEMMs on compute capability 8.9+):
- weights of the planned MatMul/Gemm nodes stored as FLOAT8E4M3FN initializers with one scale
  per output channel (``amax / 448``), each followed by a DequantizeLinear;
- the activation input of each planned node through one QuantizeLinear -> DequantizeLinear pair
  with a per-tensor scale ``amax / 448``, amax read from the INT8 calibration cache (the same
  ranges: one calibration serves INT8 and FP8);
- everything else float32: the nodes the INT8 plan keeps in float (norms, softmax, residual
  adds, embeddings, lm_head, q_head) are never touched.

The planning (:func:`~hrm_deploy.precision.calibrate.plan_nodes`), calibration and cache are the
INT8 path's (:func:`~hrm_deploy.precision.job.calibrate_job`). ONNX Runtime's static
quantizer is not used here: its FP8 mode is a QDQ variant with its own calibration path, and
our graph rewrite is a few dozen lines. Float8 Q/DQ needs opset 19: the graph's default-domain
opset is raised to 19 (the operators that changed from 18 to 19 only gained float8 types).
"""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import numpy as np

from hrm_deploy.data.examples import Examples
from hrm_deploy.errors import DataError, InternalError
from hrm_deploy.precision.calibrate import QuantPlan, quantize_qdq

logger = logging.getLogger(__name__)

E4M3_MAX = 448.0  # largest finite FLOAT8E4M3FN value
FP8_OPSET = 19  # QuantizeLinear / DequantizeLinear with float8 types
_TINY = 1e-12  # an all-zero channel or tensor still gets a valid (non-zero) scale


def _fp8_tensor(name: str, values: np.ndarray):
    """A FLOAT8E4M3FN initializer of ``values`` (already scaled into +-448), round to nearest even."""
    import ml_dtypes
    from onnx import TensorProto, helper

    clipped = np.clip(values, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
    return helper.make_tensor(name, TensorProto.FLOAT8E4M3FN, values.shape, clipped.view(np.uint8).tobytes(), raw=True)


def fp8_weight(weight: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel FP8 of ``weight`` along ``axis`` (the output channels): (scaled values in
    +-448 as float32, scale per channel = amax / 448)."""
    reduce = tuple(i for i in range(weight.ndim) if i != axis)
    scale = np.maximum(np.abs(weight).max(axis=reduce), _TINY) / E4M3_MAX
    shape = [1] * weight.ndim
    shape[axis] = -1
    return weight / scale.reshape(shape), scale.astype(np.float32)


def _weight_axis(node, weight: np.ndarray) -> int:
    """The output-channel axis of a MatMul ([K, N]: last) or Gemm weight (B: 1, or 0 with transB)."""
    if node.op_type == "Gemm":
        trans = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans else 1
    return weight.ndim - 1


def activation_amax(cache_file: Path) -> dict[str, float]:
    """max |x| of every calibrated activation in ``cache_file`` (at least a tiny positive value,
    so an all-zero tensor still gets a valid scale)."""
    from onnxruntime.quantization.calibrate import load_tensors_data

    peaks = {}
    for name, data in load_tensors_data(str(cache_file)).data.items():
        low, high = data.range_value
        amax = max(abs(float(np.asarray(low).max())), abs(float(np.asarray(high).max())))
        peaks[name] = max(amax, _TINY)
    return peaks


def activation_scales(cache_file: Path) -> dict[str, float]:
    """Per-tensor FP8 scales (amax / 448) of every calibrated activation in ``cache_file``."""
    return {name: amax / E4M3_MAX for name, amax in activation_amax(cache_file).items()}


def raise_opset(model, version: int = FP8_OPSET, ir_version: int = 9) -> None:
    """Raise the default-domain opset (and IR version) to what float8 (or float4) Q/DQ needs."""
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version < version:
            opset.version = version
    model.ir_version = max(model.ir_version, ir_version)


def write_fp8_qdq(model, plan: QuantPlan, scales: dict[str, float]) -> None:
    """Rewrite ``model`` in place: FP8 weights (per channel) and FP8 Q/DQ on the activation input
    of every node in ``plan.quantize``. (One pass over the nodes, long on purpose: the maps of
    tensors already quantized are shared by the activation and the weight halves.)"""
    from onnx import TensorProto, helper, numpy_helper

    from hrm_deploy.export.graph import topological_sort

    graph = model.graph
    raise_opset(model)
    inits = {i.name: i for i in graph.initializer}
    planned = set(plan.quantize)
    zero = "hrm_deploy_fp8/zero"
    graph.initializer.append(helper.make_tensor(zero, TensorProto.FLOAT8E4M3FN, [], b"\x00", raw=True))
    weights: dict[tuple[str, int], str] = {}  # (initializer, axis) -> dequantized weight tensor
    activations: dict[str, str] = {}  # float tensor -> its Q/DQ output
    added = []
    for node in graph.node:
        if node.name not in planned:
            continue
        x, w = node.input[0], node.input[1]
        if x not in scales:
            raise InternalError(f"no calibrated range for {x!r}: the calibration cache does not match the graph")
        if x not in activations:
            base = f"{x}/fp8"
            scale = f"{base}/scale"
            graph.initializer.append(numpy_helper.from_array(np.array(scales[x], np.float32), scale))
            added += [
                helper.make_node("QuantizeLinear", [x, scale, zero], [f"{base}/q"], name=f"{base}/QuantizeLinear"),
                helper.make_node(
                    "DequantizeLinear", [f"{base}/q", scale, zero], [f"{base}/dq"], name=f"{base}/DequantizeLinear"
                ),
            ]
            activations[x] = f"{base}/dq"
        values = numpy_helper.to_array(inits[w]).astype(np.float32)
        axis = _weight_axis(node, values)
        if (w, axis) not in weights:
            base = f"{w}/fp8_axis{axis}"
            scaled, channel_scale = fp8_weight(values, axis)
            graph.initializer.extend(
                [
                    _fp8_tensor(f"{base}/e4m3", scaled),
                    numpy_helper.from_array(channel_scale, f"{base}/scale"),
                    helper.make_tensor(
                        f"{base}/zero",
                        TensorProto.FLOAT8E4M3FN,
                        [channel_scale.size],
                        bytes(channel_scale.size),
                        raw=True,
                    ),
                ]
            )
            added.append(
                helper.make_node(
                    "DequantizeLinear",
                    [f"{base}/e4m3", f"{base}/scale", f"{base}/zero"],
                    [f"{base}/dq"],
                    name=f"{base}/DequantizeLinear",
                    axis=axis,
                )
            )
            weights[(w, axis)] = f"{base}/dq"
        node.input[0], node.input[1] = activations[x], weights[(w, axis)]
    graph.node.extend(added)
    # float weights nobody reads any more are dropped (the FP8 copy replaces them)
    used = {i for n in graph.node for i in n.input}
    for name in {w for w, _ in weights} - used:
        graph.initializer.remove(inits[name])
    topological_sort(graph)


def _write_fp8(model, plan: QuantPlan, cache_file: Path) -> None:
    write_fp8_qdq(model, plan, activation_scales(cache_file))


# quantize_fp8(job, out_path, exclude=()): the row's writer
# the FP8 Q/DQ graph of fp32_path, calibrated like (and from the same cache as) INT8
quantize_fp8 = partial(quantize_qdq, _write_fp8, "FP8")


def per_step_agreement(reference: str, candidate: str, examples: Examples, batch: int = 64) -> dict[str, list[float]]:
    """Per ACT step, of two unrolled graphs that expose per-step predictions (``step_predictions``
    [N, K, S], multi-step exports): exact accuracy of each (in points) and the fraction of cells
    whose argmax agrees. A single-step graph gives one step (its ``logits``)."""
    from hrm_deploy.contract import STEP_PREDICTIONS
    from hrm_deploy.metrics import IGNORE_LABEL_ID, row_scores
    from hrm_deploy.onnx_runtime import ort_session
    from hrm_deploy.puzzle_table import rows_session

    def predictions(path: str) -> np.ndarray:
        session = rows_session(ort_session(path, provider="cpu"), path)  # an external-table graph too
        names = [o.name for o in session.get_outputs()]
        parts = []
        for start in range(0, len(examples), batch):
            feeds = examples.feeds(start, start + batch)
            if STEP_PREDICTIONS in names:
                parts.append(session.run([STEP_PREDICTIONS], feeds)[0])
            else:
                parts.append(session.run(["logits"], feeds)[0].argmax(-1)[:, None, :])
        return np.concatenate(parts)  # [N, K, S]

    if examples.labels is None:
        raise DataError("these examples have no labels; per-step accuracy needs a dataset folder")
    ref, cand = predictions(reference), predictions(candidate)
    labels = examples.labels[:, None, :]
    mask = np.broadcast_to(labels != IGNORE_LABEL_ID, ref.shape)
    agree = ((ref == cand) & mask).sum((0, 2)) / np.maximum(mask.sum((0, 2)), 1)
    return {
        "reference_exact": [100.0 * float(x) for x in row_scores(ref, labels)[0].mean(0)],
        "candidate_exact": [100.0 * float(x) for x in row_scores(cand, labels)[0].mean(0)],
        "argmax_agreement": [float(x) for x in agree],
    }
