"""What a TensorRT build of an unrolled graph costs, and when it is built only on request.

Measured (``benchmarks/results/trt_build_cost.json``: TensorRT-RTX 1.7 on a 2-core machine): the
folded 16-step Sudoku-size unroll took 501 s and 3.9 GB of peak host memory to build in FP16 (19,830
ONNX nodes, static slices as gathers), 256 s and 4.6 GiB in INT8 (19,062 nodes); its single-step
graph about 5 s and 0.6 GB. The project allows an unrolled
build 3 minutes and 4 GB; an unrolled graph whose estimate is over that is refused unless asked for
(``EngineConfig.allow_unrolled``, ``build-engine --allow-unrolled``), and the estimate is printed
before such a build starts.

The estimate scales the measured build of the same precision (FP16's for FP32 and BF16, which
were not measured) by the graph's compute nodes: every node except Cast and Q/DQ, which the
precision conversion adds and TensorRT fuses away, so an export and its FP16/INT8 graphs count
alike. It is an upper estimate for small models: the bundled ``sudoku-small`` unroll (hidden 64,
2,484 compute nodes) built in 18 s where Sudoku-size scaling (of the older 1,267 s measurement)
said 165 s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hrm_deploy.errors import ConfigError

# precision -> (ONNX nodes, build seconds, peak host MiB) of the folded 16-step Sudoku-size unroll
MEASURED = {"fp16": (19_830, 501.42, 3940.0), "int8": (19_062, 256.22, 4707.6)}
BUDGET_SECONDS, BUDGET_MIB = 180.0, 4096.0  # the goal for an unrolled build
FUSED_OPS = frozenset({"Cast", "QuantizeLinear", "DequantizeLinear"})


def compute_nodes(model: Any) -> int:
    """Nodes of an ``onnx.ModelProto`` other than Cast and Q/DQ (what the cost scales with)."""
    return sum(1 for node in model.graph.node if node.op_type not in FUSED_OPS)


@dataclass(frozen=True)
class BuildCost:
    """Estimated cost of a TensorRT build of an unrolled graph."""

    nodes: int
    precision: str
    seconds: float
    peak_mib: float

    @property
    def over_budget(self) -> bool:
        return self.seconds > BUDGET_SECONDS or self.peak_mib > BUDGET_MIB

    def describe(self) -> str:
        """``about 22 min and 4.7 GB of host memory (estimate: ...)``."""
        measured = "int8" if self.precision == "int8" else "fp16"
        nodes, seconds, mib = MEASURED[measured]
        return (
            f"about {_duration(self.seconds)} and {self.peak_mib / 1024:.1f} GB of host memory (estimate: the "
            f"measured 16-step Sudoku-size {measured.upper()} build, {seconds:,.0f} s and {mib / 1024:.1f} GB for "
            f"{nodes:,} nodes on a 2-core machine, benchmarks/results/trt_build_cost.json, scaled to "
            f"{self.nodes:,} compute nodes)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "compute_nodes": self.nodes,
            "estimated_seconds": round(self.seconds),
            "estimated_peak_mib": round(self.peak_mib),
        }


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def estimate_unrolled_build(nodes: int, precision: str) -> BuildCost:
    """The build cost of an unrolled graph of ``nodes`` compute nodes, scaled from the measurement."""
    measured_nodes, seconds, mib = MEASURED["int8" if precision == "int8" else "fp16"]
    scale = nodes / measured_nodes
    return BuildCost(nodes, precision, seconds * scale, mib * scale)


def unrolled_over_budget(meta: dict[str, Any], nodes: int, precision: str) -> BuildCost | None:
    """The estimate when the graph (metadata ``meta``, ``nodes`` compute nodes) is an unrolled graph
    whose build is over the budget; None for step graphs and builds within it."""
    if meta.get("mode") != "unrolled":
        return None
    cost = estimate_unrolled_build(nodes, precision)
    return cost if cost.over_budget else None


def check_unrolled_build(
    meta: dict[str, Any], nodes: int, precision: str, allowed: bool, name: str
) -> BuildCost | None:
    """The estimate when ``name`` (graph metadata ``meta``, ``nodes`` compute nodes) is an unrolled
    graph over the budget and ``allowed``; None when it is within it or a step graph. Over the
    budget and not allowed: a :class:`ConfigError` with the estimate and the two ways on."""
    if meta.get("mode") != "unrolled":
        return None
    cost = estimate_unrolled_build(nodes, precision)
    if not cost.over_budget:
        return None
    if not allowed:
        raise ConfigError(
            f"{name} is a {meta.get('steps', '?')}-step unrolled graph; its {precision} TensorRT build would take "
            f"{cost.describe()}, over the {BUDGET_SECONDS / 60:.0f} min / {BUDGET_MIB / 1024:.0f} GB an unrolled "
            "build may take unasked: export the single-step graph (hrm-deploy export --mode step) and build that, "
            "or pass --allow-unrolled to build this one"
        )
    return cost
