"""The memory plan of the build stage: does a TensorRT engine of this graph fit the target's memory, and at what batch?

An 8 GB Jetson Orin shares its DRAM between CPU and GPU, so everything the running engine needs
comes out of one budget (:class:`~hrm_deploy.engines.targets.TargetProfile`: ``memory_budget_mib``,
less ``os_reserve_mib`` for carve-outs and the operating system):

- **weights** as the engine stores them: each initializer at the precision the build gives it
  (FP32 graphs built FP16/BF16 halve their float weights; Q/DQ graphs keep their int8/fp8/fp4
  weights); for a built engine, its plan file's size;
- **the puzzle-embedding table**, resident in the engine (``--puzzle-emb embedded``), or
  memory-mapped read-only from disk beside an external-table export (``--puzzle-emb external``:
  pages the kernel can drop, so it costs no resident memory);
- per **batch bucket** B (the device loop keeps one set of buffers per batch size it has run):
  the carry in and out (4 x B x T x D float32: z_H and z_L, ping-ponged) and the I/O (token ids,
  puzzle ids, logits B x S x V float32, the halting logits); the activation scratch, shared by
  every bucket, is the largest bucket's (below);
- **the runtime's own**: CUDA context and TensorRT's libraries (``runtime_mib``).

Activations are an estimate per row of one ACT step (TensorRT reuses memory layer by layer, so the
peak is one block's live tensors): T x (4D + max(4D + heads x T, 3I)) elements at the build's
activation width (2 bytes for FP16/BF16 and the Q/DQ precisions, whose non-GEMM layers run in 16
bits; 4 for FP32), for T = sequence + puzzle prefix, D hidden, I the SwiGLU width: the carry and
input embedding, the residual stream and, at the peak, either attention (Q, K, V, scores, output)
or the MLP (gate, up, down). On a board, the engine's own ``device_memory_size_v2`` replaces it
(``bench --target jetson`` records the RAM used). A build on the board also needs the builder's
workspace plus its own host memory (:data:`BUILD_MIB_PER_NODE`), said beside the plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hrm_deploy.engines.targets import TargetProfile, get_target
from hrm_deploy.errors import ConfigError

MIB = 1 << 20
# Host memory of a TensorRT build per ONNX node, measured: the 16-step Sudoku unroll
# (58,206 nodes, 152 MB) peaked at 9.3 GB in TensorRT-RTX on 2 cores.
BUILD_MIB_PER_NODE = 0.16
# bits per element of ONNX initializer types (TensorProto.DataType numbers)
BITS = {1: 32, 2: 8, 3: 8, 5: 16, 6: 32, 7: 64, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64, 16: 16, 17: 8, 18: 8, 23: 4}
FLOAT_TYPES = {1, 10, 16}  # FLOAT, FLOAT16, BFLOAT16: what an FP16/BF16 build stores in 16 bits
NARROW = {"fp16": 16, "bf16": 16}  # float weights' width in an engine of this precision (else as stored)
TABLE_SUFFIX = "puzzle_emb.weights"  # the puzzle-embedding table's initializer (export/onnx_export.py)


@dataclass(frozen=True)
class Bucket:
    """One batch size's buffers (bytes) and the running total with every bucket up to it held."""

    batch: int
    activations: int  # the shared scratch, sized for this bucket
    carry: int  # z_H, z_L in and out, float32
    io: int  # token and puzzle ids, logits and halting logits
    total: int  # fixed + the largest scratch + every bucket's carry and I/O up to this one
    fits: bool


@dataclass(frozen=True)
class MemoryPlan:
    """What an engine of ``artifact`` needs on ``target`` (bytes unless named ``_mib``)."""

    artifact: str
    target: str
    precision: str
    mode: str
    budget_mib: int  # the target's memory, less its reserve for carve-outs and the OS
    reserve_mib: int
    runtime_mib: int  # CUDA context and TensorRT's libraries
    weights: int
    weights_from: str  # "engine file" or "ONNX initializers at <precision>"
    puzzle_table: int  # the table's bytes (resident only when embedded)
    table_resident: bool
    workspace_mib: int  # the builder's workspace limit (a build on the board)
    build_mib: int  # the builder's own host memory, estimated (a build on the board)
    buckets: list[Bucket] = field(default_factory=list)

    @property
    def fixed(self) -> int:
        """Bytes held whatever the batch: runtime, weights and a resident table."""
        return self.runtime_mib * MIB + self.weights + (self.puzzle_table if self.table_resident else 0)

    @property
    def largest_batch(self) -> int | None:
        """The largest bucket that fits with every smaller bucket held too (None: not even batch 1)."""
        fitting = [b.batch for b in self.buckets if b.fits]
        return max(fitting) if fitting else None

    @property
    def fits(self) -> bool:
        """Every bucket of the profile fits."""
        return all(b.fits for b in self.buckets)

    @property
    def build_fits(self) -> bool:
        """A build on the board (workspace plus the builder's own memory) fits the budget."""
        return self.workspace_mib + self.build_mib <= self.budget_mib

    def advice(self) -> list[str]:
        """What to change when the profile does not fit, each with what it frees."""
        if self.fits:
            return []
        tips = []
        if self.largest_batch is not None:
            tips.append(f"--max-batch {self.largest_batch} (the largest batch that fits)")
        if self.table_resident and self.puzzle_table >= 64 * MIB:
            tips.append(
                f"export with --puzzle-emb external (the {self.puzzle_table / MIB:.0f} MiB puzzle table memory-mapped "
                "from disk instead of resident)"
            )
        if self.precision == "fp32":
            tips.append(
                f"a 16-bit precision (--fp16: weights {self.weights / 2 / MIB:.0f} MiB instead of {self.weights / MIB:.0f})"
            )
        elif self.precision in NARROW:
            tips.append("--int8 (weights in 8 bits; calibrated, within --accuracy-budget)")
        if self.mode == "unrolled":
            tips.append("the single-step graph (export --mode step): one ACT step's activations")
        return tips

    def refusal(self) -> str:
        """One line: what does not fit and what to change."""
        worst = self.buckets[-1]
        return (
            f"an engine of {Path(self.artifact).name} at batch {worst.batch} needs {worst.total / MIB:.0f} MiB on "
            f"{self.target}, over the {self.budget_mib} MiB it has (after {self.reserve_mib} MiB for the system): "
            + "; or ".join(self.advice())
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "fixed": self.fixed,
            "largest_batch": self.largest_batch,
            "fits": self.fits,
            "build_fits": self.build_fits,
        }

    def table(self) -> str:
        """The plan as a Markdown table (MiB)."""
        mib = lambda n: f"{n / MIB:,.1f}"  # noqa: E731
        table = "resident" if self.table_resident else "memory-mapped from disk, not resident"
        lines = [
            f"# memory plan: {Path(self.artifact).name} on {self.target} ({self.precision}, {self.mode} graph)",
            "",
            f"budget {self.budget_mib:,} MiB (after {self.reserve_mib:,} MiB for carve-outs and the system)",
            "",
            "| what | MiB |",
            "|---|---|",
            f"| runtime (CUDA context, TensorRT) | {self.runtime_mib:,.1f} |",
            f"| weights ({self.weights_from}) | {mib(self.weights)} |",
            f"| puzzle table ({table}) | {mib(self.puzzle_table)} |",
            "",
            "| batch | activations | carry | I/O | total with buckets 1..batch held | fits |",
            "|---|---|---|---|---|---|",
        ]
        for b in self.buckets:
            lines.append(
                f"| {b.batch} | {mib(b.activations)} | {mib(b.carry)} | {mib(b.io)} | {mib(b.total)} | "
                f"{'yes' if b.fits else 'no'} |"
            )
        build = (
            "fits"
            if self.build_fits
            else "does not fit: build on a desktop with the same TensorRT, or lower --workspace"
        )
        lines += [
            "",
            f"largest batch that fits: {self.largest_batch if self.largest_batch is not None else 'none'}",
            f"a build on the board: workspace {self.workspace_mib:,} MiB + builder about {self.build_mib:,} MiB: {build}",
        ]
        lines += [f"- to fit: {tip}" for tip in self.advice()]
        return "\n".join(lines) + "\n"


def _elements(dims: Any) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _initializers(graph: Any) -> list[Any]:
    """Every initializer of ``graph`` and of the subgraphs in its nodes' attributes (a Loop's body)."""
    found = list(graph.initializer)
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("g"):
                found += _initializers(attribute.g)
    return found


def weight_bytes(model: Any, precision: str) -> tuple[int, int]:
    """(weights, puzzle table) in bytes as an engine of ``precision`` stores the initializers of
    ``model`` (an ``onnx.ModelProto``, including a loop graph's body)."""
    narrow = NARROW.get(precision)
    weights = table = 0
    for init in _initializers(model.graph):
        bits = BITS.get(init.data_type, 32)
        if narrow and init.data_type in FLOAT_TYPES:
            bits = narrow
        size = _elements(init.dims) * bits // 8
        if init.name.endswith(TABLE_SUFFIX):
            table += size
        else:
            weights += size
    return weights, table


def build_estimate_mib(nodes: int, onnx_bytes: int) -> int:
    """Host memory a TensorRT build of a graph of ``nodes`` nodes and ``onnx_bytes`` bytes needs (MiB)."""
    return int(nodes * BUILD_MIB_PER_NODE + 3 * onnx_bytes / MIB)


def _buckets(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to ``max_batch`` (and ``max_batch`` itself)."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch]


def plan_graph(
    model: Any,
    meta: dict[str, Any],
    target: TargetProfile,
    precision: str,
    *,
    artifact: str = "",
    max_batch: int | None = None,
    puzzle_emb: str = "embedded",
    engine_bytes: int | None = None,
) -> MemoryPlan:
    """The plan for an engine of ``model`` (its hrm_deploy metadata ``meta``) on ``target``;
    ``engine_bytes``: the built engine's size, in place of the weights estimate."""
    from hrm_deploy.model.families import config_from_dict

    if not target.memory_budget_mib:
        raise ConfigError(f"target {target.name} has no memory budget to plan against; use --target jetson-orin-8gb")
    cfg = config_from_dict(meta["config"])
    weights, table = weight_bytes(model, precision)
    if puzzle_emb == "external":  # the graph takes gathered rows; the table is a file beside it
        table = cfg.num_puzzle_identifiers * cfg.puzzle_emb_ndim * 4
    t, d, s, v = cfg.total_seq_len, cfg.hidden_size, cfg.seq_len, cfg.vocab_size
    width = 4 if precision == "fp32" else 2
    per_row = t * (4 * d + max(4 * d + cfg.num_heads * t, 3 * cfg.intermediate_size)) * width
    steps = int(meta.get("steps", 1)) if meta.get("mode") == "unrolled" else 1
    carry_row = 4 * t * d * 4 if meta.get("mode") == "step" else 0
    io_row = s * 8 + 8 + s * v * 4 + 2 * 4 * steps + (cfg.puzzle_emb_ndim * 4 if puzzle_emb == "external" else 0)
    budget = target.memory_budget_mib - target.os_reserve_mib
    plan = MemoryPlan(
        artifact,
        target.name,
        precision,
        str(meta.get("mode", "?")),
        budget,
        target.os_reserve_mib,
        target.runtime_mib,
        engine_bytes if engine_bytes is not None else weights,
        "engine file" if engine_bytes is not None else f"ONNX initializers at {precision}",
        table,
        puzzle_emb != "external",
        target.workspace_mib,
        build_estimate_mib(len(model.graph.node), weights + table),
    )
    held = 0
    for batch in _buckets(max_batch or target.max_batch):
        held += batch * (carry_row + io_row)
        total = plan.fixed + batch * per_row + held
        bucket = Bucket(batch, batch * per_row, batch * carry_row, batch * io_row, total, total <= budget * MIB)
        plan.buckets.append(bucket)
    return plan


def memory_plan(
    artifact: str | Path,
    target: str = "jetson-orin-8gb",
    *,
    precision: str | None = None,
    max_batch: int | None = None,
) -> MemoryPlan:
    """The memory plan of ``artifact`` (an exported or precision ONNX graph, or a TensorRT engine:
    its parent graph's sizes and its own file size) on ``target``. ``precision``: what the graph
    will be built as (default: the graph's own; an FP32 export defaults to FP16, what
    ``build-engine`` builds for this target); ``max_batch``: the profile's largest batch (default:
    the engine's, else the target's)."""
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.manifest import check_artifact, resolve_parent
    from hrm_deploy.onnx_runtime import load_onnx

    path = Path(artifact)
    profile = get_target(target)
    engine_bytes = None
    graph, manifest = path, check_artifact(path) or {}
    if path.suffix != ".onnx":  # an engine: sizes from the graph it was built from
        parent = resolve_parent(path, manifest)
        if parent is None or not parent.is_file():
            raise ConfigError(f"{path.name} records no ONNX graph it was built from; plan its graph instead")
        engine_bytes, graph = path.stat().st_size, parent
        shapes = manifest.get("profile_shapes") or {}
        first = next(iter(shapes.values()), None)
        max_batch = max_batch or (int(first[2][0]) if first else None)
        precision = precision or manifest.get("precision")
    model = load_onnx(graph)
    meta = graph_metadata(model)
    chosen = precision or (meta.get("precision") if meta.get("precision") != "fp32" else "fp16")
    return plan_graph(
        model,
        meta,
        profile,
        str(chosen),
        artifact=str(path),
        max_batch=max_batch,
        puzzle_emb=str(meta.get("puzzle_emb", "embedded")),
        engine_bytes=engine_bytes,
    )
