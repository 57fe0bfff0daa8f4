"""Which integer GEMM the static INT8 graph asks of ONNX Runtime on this CPU: measured, not guessed.

ORT's CPU runs a Q/DQ MatMul as ``MatMulIntegerToFloat`` with either uint8 activations (zero
point 128: U8S8, the native form of AVX2's ``vpmaddubsw`` and AVX-512/AVX VNNI's ``vpdpbusd``)
or int8 activations (S8S8: AMX's ``tdpbssd``; on AVX2 MLAS emulates it). Both read the same
symmetric calibration ranges, so they give the same quantized values; only the speed differs,
and it differs by machine: on an AMX Xeon S8S8 ran 1.2-1.4x U8S8 on the Sudoku-size MLP GEMM,
and AVX2 machines run U8S8 natively. The build times one GEMM of the model's own shape both
ways (well under a second) and records the choice, the timings and the CPU's ISA flags.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

ACTIVATIONS = ("auto", "uint8", "int8")
ISA_FLAGS = ("amx_int8", "amx_bf16", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512f", "avx2")
ROUNDS = 5  # interleaved rounds of the two GEMMs; the median of the per-round times decides


def isa_flags() -> list[str]:
    """The vector-ISA flags INT8 speed depends on that /proc/cpuinfo lists (empty off Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    return [f for f in ISA_FLAGS if f in flags]


def qdq_matmul_graph(tokens: int, k: int, n: int, activation: str) -> bytes:
    """One ``x [tokens, k] @ W [k, n]`` with Q/DQ on both inputs, the way the static recipe writes it."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = rng.integers(-127, 128, (k, n), dtype=np.int8)
    act = np.uint8 if activation == "uint8" else np.int8
    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(128 if activation == "uint8" else 0, act), "x_zero"),
        numpy_helper.from_array(weight, "w_q"),
        numpy_helper.from_array(np.full(n, 0.01, np.float32), "w_scale"),
        numpy_helper.from_array(np.zeros(n, np.int8), "w_zero"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zero"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zero"], ["w_dq"], axis=1),
        helper.make_node("MatMul", ["x_dq", "w_dq"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [tokens, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [tokens, n])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model.SerializeToString()


def time_sessions(sessions: dict[str, Any], feeds: dict[str, Any], rounds: int, reps: int) -> dict[str, list[float]]:
    """ms per run of each session, one entry per round; rounds interleave the sessions (load from
    other processes falls on all alike), after one warm-up run each (weight pre-packing)."""
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for session in sessions.values():
        session.run(None, feeds)
    for _ in range(rounds):
        for name, session in sessions.items():
            start = time.perf_counter()
            for _ in range(reps):
                session.run(None, feeds)
            times[name].append((time.perf_counter() - start) / reps * 1e3)
    return times


def choose_activations(requested: str, tokens: int, k: int, n: int, threads: int | None) -> dict[str, Any]:
    """The activation type for ``requested`` (``auto``: the faster of U8S8 and S8S8 on one
    ``[tokens, k] @ [k, n]`` GEMM here, e.g. a layer's MLP input projection at batch 1).
    Returns ``{"activations", "chosen_by", "isa", and with auto the two medians in ms}``."""
    record: dict[str, Any] = {"activations": requested, "chosen_by": "--cpu-int8-activations", "isa": isa_flags()}
    if requested != "auto":
        return record
    from hrm_deploy.onnx_runtime import ort_session

    x = np.random.default_rng(1).standard_normal((tokens, k)).astype(np.float32)
    # no spinning: an idle pool busy-waiting after its run would slow the other session's next run
    sessions = {
        a: ort_session(qdq_matmul_graph(tokens, k, n, a), threads=threads, spinning=False) for a in ("uint8", "int8")
    }
    times = time_sessions(sessions, {"x": x}, ROUNDS, 3)
    medians = {a: statistics.median(t) for a, t in times.items()}
    # ties (within 5 %) keep uint8: U8S8 is the form every x86 CPU with AVX2 runs natively
    chosen = "int8" if medians["int8"] < 0.95 * medians["uint8"] else "uint8"
    record.update(
        activations=chosen,
        chosen_by=f"measured: one [{tokens}x{k}] @ [{k}x{n}] GEMM, U8S8 vs S8S8, median of {ROUNDS} rounds",
        u8s8_ms=round(medians["uint8"], 4),
        s8s8_ms=round(medians["int8"], 4),
    )
    return record
