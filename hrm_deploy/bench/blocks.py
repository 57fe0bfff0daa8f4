"""Per-layer timings folded into the model's blocks: the rows of ``hrm-deploy profile``.

Every backend reports time under its own layer names: ONNX Runtime per graph node, TensorRT per
(fused) layer, torch.profiler per operator or per module scope. The export keeps the PyTorch
module path in every node name (the TorchScript exporter's scope names, e.g.
``step3//L_level/layers.0/self_attn/qkv_proj/MatMul``; the cpu target's fusions and ORT's own
optimizer keep the first node's name as a prefix; TensorRT names a layer after its ONNX node,
a fused layer after all of them joined by ``+``), so one rule table maps a layer of any backend
to its block. Host work (the runtime's scheduling between kernels, the runner's copies and its
step loop) is the difference between the wall time of a call and the layers' sum, shown as its
own rows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Block(str, Enum):
    """The rows of a profile, in model order; host rows last."""

    EMBEDDING = "embedding"
    QKV = "QKV projection"
    ATTENTION = "attention core"
    O_PROJ = "output projection"
    MLP = "MLP"
    NORM = "norms + residuals"
    LM_HEAD = "lm head"
    Q_HEAD = "q (halting) head"
    CARRY = "carry + halting"
    QUANTIZE = "quantize (Q/DQ)"
    REFORMAT = "reformat / copies"
    OTHER = "other"
    COMPILED = "compiled code (no per-kernel events)"
    HOST_RUNTIME = "host: runtime between kernels"
    HOST_RUNNER = "host: runner (copies, step loop)"


HOST_BLOCKS = (Block.HOST_RUNTIME, Block.HOST_RUNNER)
QUANTIZE_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
# (pattern on the layer name, block); the first match wins. The module rules come before the
# embedding's, because a reference module path starts with ``embed_init.core`` for every block.
_RULES: tuple[tuple[re.Pattern[str], Block], ...] = tuple(
    (re.compile(pattern), block)
    for pattern, block in (
        (r"^\(runner\)$", Block.HOST_RUNNER),  # work a runner does outside the model (input/output copies)
        (r"(?i)reformat|copynode|\bcopy\b", Block.REFORMAT),
        (r"(^|/)qkv_proj(_\d+)?\b", Block.QKV),
        (r"(^|/)o_proj(_\d+)?\b", Block.O_PROJ),
        (r"/self_attn(_\d+)?/|/self_attn$|rotary|attention", Block.ATTENTION),
        (r"(^|/)mlp(_\d+)?\b", Block.MLP),
        (r"(^|/)lm_head(_\d+)?\b", Block.LM_HEAD),
        (r"(^|/)q_head(_\d+)?\b", Block.Q_HEAD),
        (r"/layers\.\d+(_\d+)?(/|$)", Block.NORM),
        (r"^embed|(^|/)embed_tokens\b|(^|/)puzzle_emb\b|/embed_init\b", Block.EMBEDDING),
        (
            r"(^|/)(step\d*|[HL]_level|output|reset|q_halt|q_continue)(/|_|$)|^/?(Add|Gather|Slice|Concat|Squeeze|Unsqueeze)",
            Block.CARRY,
        ),
    )
)


def module_path(name: str) -> str:
    """A layer name as a slash path: ``embed_init.core.H_level.layers.0.mlp`` (a torch module)
    becomes ``/embed_init/core/H_level/layers.0/mlp``; ONNX and TensorRT names are kept."""
    if "/" in name or "." not in name:
        return name
    return "/" + re.sub(r"\.(?!\d)", "/", name)


def classify(name: str, op: str = "") -> Block:
    """The block of one layer, by its name (module path) and op type. TensorRT's fused layers
    (``a + b``, ``{ForeignNode[a...b]}``) go to the block of their first named part."""
    if op in QUANTIZE_OPS or re.search(r"(^|/)(Quantize|Dequantize)Linear|_quantize(d)?\b", name):
        return Block.QUANTIZE
    for part in re.split(r"\s\+\s|\.\.\.", name.strip("{}")):
        path = module_path(re.sub(r"^\{?ForeignNode\[", "", part).strip())
        for pattern, block in _RULES:
            if pattern.search(path):
                return block
    return Block.OTHER


@dataclass
class Layer:
    """One timed layer (a node, a fused layer, an operator or a module's own time)."""

    name: str
    op: str
    ms: float  # over every call profiled
    count: int = 1


@dataclass
class Profile:
    """A profile of ``calls`` calls of ``artifact`` at ``batch``: the layers' times (ms, summed
    over the calls) and, where measured, the wall time of the calls (for the host rows)."""

    artifact: str
    runner: str
    precision: str
    source: str  # which profiler: "onnxruntime session profiler", "torch.profiler", ...
    batch: int
    steps: int
    calls: int
    layers: list[Layer] = field(default_factory=list)
    wall_ms: float | None = None  # summed wall time of the calls (host in, host out)
    runtime_ms: float | None = None  # summed time the runtime says it ran (ORT's model_run)
    environment: dict[str, Any] = field(default_factory=dict)
    # where the wall time beyond the layers goes: the runner's host work, or (a compiled engine
    # whose kernels the profiler cannot see, e.g. AOTInductor on the CPU) that compiled code
    gap: Block = Block.HOST_RUNNER

    def rows(self) -> list[dict[str, Any]]:
        """One row per block: ms per call, ms per ACT step, share of the call, and the layers
        and op types behind it, in :class:`Block` order; host rows where measured."""
        totals: dict[Block, float] = {}
        nodes: dict[Block, int] = {}
        ops: dict[Block, dict[str, float]] = {}
        for layer in self.layers:
            block = classify(layer.name, layer.op)
            totals[block] = totals.get(block, 0.0) + layer.ms
            nodes[block] = nodes.get(block, 0) + layer.count
            per_op = ops.setdefault(block, {})
            per_op[layer.op] = per_op.get(layer.op, 0.0) + layer.ms
        kernels = sum(totals.values())
        if self.runtime_ms is not None and self.runtime_ms > kernels:
            totals[Block.HOST_RUNTIME] = self.runtime_ms - kernels
        inner = self.runtime_ms if self.runtime_ms is not None else kernels
        if self.wall_ms is not None and self.wall_ms > inner:
            totals[self.gap] = totals.get(self.gap, 0.0) + self.wall_ms - max(inner, kernels)
        whole = sum(totals.values()) or 1.0
        calls, steps = max(self.calls, 1), max(self.steps, 1)
        return [
            {
                "block": block.value,
                "ms_per_call": totals[block] / calls,
                "ms_per_step": totals[block] / calls / steps,
                "share": totals[block] / whole,
                "layers_per_call": nodes.get(block, 0) / calls,
                "top_ops": [op for op, _ in sorted(ops.get(block, {}).items(), key=lambda kv: -kv[1])[:3]],
            }
            for block in Block
            if block in totals
        ]

    def as_dict(self) -> dict[str, Any]:
        """The JSON written beside the bench report (rows plus where they came from)."""
        rows = self.rows()
        total = sum(r["ms_per_call"] for r in rows)
        return {
            "artifact": self.artifact,
            "runner": self.runner,
            "precision": self.precision,
            "profiler": self.source,
            "batch": self.batch,
            "steps": self.steps,
            "calls": self.calls,
            "ms_per_call": total,
            "ms_per_step": total / max(self.steps, 1),
            "wall_ms_per_call": None if self.wall_ms is None else self.wall_ms / max(self.calls, 1),
            "rows": rows,
            "environment": self.environment,
        }


# Control-flow nodes whose time is their body's: the body's own nodes are profiled one by one
# (a loop graph's ``Loop``), so counting the container too would count the work twice.
CONTAINER_OPS = ("Loop", "If", "Scan")


def fold(events: Iterable[tuple[str, str, float]]) -> list[Layer]:
    """Layers from ``(name, op, ms)`` events, one per distinct (name, op), times summed; control-flow
    containers (:data:`CONTAINER_OPS`) are left out, their bodies' nodes are the layers."""
    layers: dict[tuple[str, str], Layer] = {}
    for name, op, ms in events:
        if op in CONTAINER_OPS:
            continue
        layer = layers.get((name, op))
        if layer is None:
            layers[(name, op)] = Layer(name, op, ms)
        else:
            layer.ms += ms
            layer.count += 1
    return list(layers.values())


def table(profile: dict[str, Any]) -> str:
    """A profile (:meth:`Profile.as_dict`) as a markdown table."""
    head = "| block | share | ms per call | ms per step | layers per call | top ops |\n|---|---|---|---|---|---|"
    lines = [
        f"| {r['block']} | {r['share']:.1%} | {r['ms_per_call']:.3f} | {r['ms_per_step']:.3f} | "
        f"{r['layers_per_call']:.0f} | {', '.join(r['top_ops'])} |"
        for r in profile["rows"]
    ]
    total = (
        f"| **total** | 100% | {profile['ms_per_call']:.3f} | {profile['ms_per_step']:.3f} | "
        f"{sum(r['layers_per_call'] for r in profile['rows']):.0f} | |"
    )
    title = (
        f"{profile['runner']} {profile['precision']} {profile['artifact']}: batch {profile['batch']}, "
        f"{profile['steps']} ACT steps, {profile['calls']} calls, {profile['profiler']}"
    )
    return "\n".join([title, "", head, *lines, total]) + "\n"


def compare(a: dict[str, Any], b: dict[str, Any]) -> str:
    """Per-step ms of two profiles side by side, block by block, with the ratio a / b (how many
    times faster ``b`` runs that block)."""
    name_a, name_b = _label(a), _label(b)
    rows_a = {r["block"]: r for r in a["rows"]}
    rows_b = {r["block"]: r for r in b["rows"]}
    head = f"| block | {name_a} ms/step | {name_b} ms/step | {name_a} / {name_b} |\n|---|---|---|---|"
    lines = []
    for block in [blk.value for blk in Block if blk.value in rows_a or blk.value in rows_b]:
        ms_a = rows_a.get(block, {}).get("ms_per_step", 0.0)
        ms_b = rows_b.get(block, {}).get("ms_per_step", 0.0)
        ratio = f"{ms_a / ms_b:.2f}x" if ms_a and ms_b else "-"
        lines.append(f"| {block} | {ms_a:.3f} | {ms_b:.3f} | {ratio} |")
    total_a, total_b = a["ms_per_step"], b["ms_per_step"]
    lines.append(f"| **total** | {total_a:.3f} | {total_b:.3f} | {total_a / total_b:.2f}x |" if total_b else "")
    return "\n".join([head, *lines]) + "\n"


def _label(profile: dict[str, Any]) -> str:
    return f"{profile['runner']} {profile['precision']}"
