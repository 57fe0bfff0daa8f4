"""Which integer GEMM the static INT8 graph asks of ONNX Runtime on this CPU: chosen from the ISA.

ORT's CPU runs a Q/DQ MatMul as ``MatMulIntegerToFloat`` with either uint8 activations (zero
point 128: U8S8, the native form of AVX2's ``vpmaddubsw`` and AVX-512/AVX VNNI's ``vpdpbusd``)
or int8 activations (S8S8: AMX's ``tdpbssd``; without AMX, a kernel that is not the CPU's native
form). Both read the same symmetric calibration ranges, so they hold the same quantized
values. The choice is the machine's (its ISA flags, read once) or the caller's, never a stopwatch:
a numerics choice made by timing would change with the load of the machine, and the accuracy
verdict with it. :func:`choose_activations` says which and why; the manifest records it with the
flags. On an AMX Xeon S8S8 ran 1.2-1.4x U8S8 on the Sudoku-size MLP GEMM; VNNI and AVX2 machines
run U8S8 natively (on AVX2 without VNNI ``vpmaddubsw`` sums pairs of products in int16, which can
saturate: the build's measurement sees those numerics, since it runs them).

:func:`qdq_matmul_graph` and :func:`time_sessions` time both forms of one GEMM
(``benchmarks/cpu_profile.py``), to check the table against a machine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

ISA_FLAGS = ("amx_int8", "amx_bf16", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512f", "avx2")


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


def activations_for(flags: list[str]) -> tuple[str, str]:
    """The activation type for a CPU with these ISA ``flags`` and why (see the module docstring)."""
    if "amx_int8" in flags:
        return "int8", "AMX-INT8: S8S8 runs on AMX's tdpbssd (measured 1.2-1.4x U8S8)"
    if "avx512_vnni" in flags or "avx_vnni" in flags:
        return "uint8", "VNNI: U8S8 is vpdpbusd's native form (int32 sums, no saturation)"
    return "uint8", "no VNNI or AMX: U8S8 is AVX2's native form (vpmaddubsw)"


def choose_activations(requested: str, mode: str) -> dict[str, Any]:
    """The activation type for ``requested`` (``auto``: from this CPU's ISA flags) of a graph of
    ``mode``. Returns ``{"activations", "chosen_by", "isa"}``. A loop graph takes uint8: ONNX
    Runtime fuses only U8S8 Q/DQ inside a Loop's body (S8S8 rewrites the weights, which a body reads
    from the outer graph); int8 asked for one is refused in one line."""
    from hrm_deploy.errors import ConfigError

    flags = isa_flags()
    if mode == "loop":
        if requested == "int8":
            raise ConfigError(
                "int8 activations of a loop graph are not offered: ONNX Runtime turns S8S8 Q/DQ into integer "
                "GEMMs only where it may rewrite the weights, and a loop's body reads them from the outer graph; "
                "use uint8 or auto"
            )
        why = "a loop graph: ONNX Runtime fuses only U8S8 Q/DQ inside a Loop's body"
        return {"activations": "uint8", "chosen_by": why, "isa": flags}
    if requested != "auto":
        return {"activations": requested, "chosen_by": "asked for (--cpu-int8-activations)", "isa": flags}
    chosen, why = activations_for(flags)
    return {"activations": chosen, "chosen_by": f"this CPU's ISA: {why}", "isa": flags}
