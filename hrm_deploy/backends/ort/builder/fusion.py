"""Fusions of HRM's attention and RMSNorm into ONNX Runtime's fused CPU kernels.

At hidden 64 (the bundled model) much of a call is ORT's per-node cost: after ORT's own
optimizer a transformer block is about 46 nodes, 42 of them outside the four weight GEMMs. ORT fuses
neither HRM's weightless RMSNorm nor its rotate-half RoPE attention, so this pass does, on the
graph ORT saved after its extended-level passes (the patterns below are that graph's).
Measured (``benchmarks/results/cpu_fusion_latency.json``, fused vs ``--no-fuse`` rows): 1.25x FP32 and
1.33x INT8 at batch 8 on the bundled model, 1.09x / 1.25x at Sudoku size; attention is the gain.

* **attention** (24 nodes -> 4-5): ``Reshape [B,S,3N,D] -> Split(q, k, v)``, on q and k the
  rotate-half RoPE (``x*cos + concat(-x2, x1)*sin``), the transposes, ``FusedMatMul(alpha)``,
  ``Softmax``, ``MatMul`` by v, the transpose and ``Reshape [B,S,N*D]`` become
  ``Split`` on the last axis, ``com.microsoft.RotaryEmbedding`` on q and k (cos/sin caches are
  the graph's own tables, first half: rotate-half repeats them) and
  ``com.microsoft.MultiHeadAttention`` (``scale`` = alpha, not causal).
* **RMSNorm** (5 nodes -> 1): ``x / sqrt(mean(x*x, -1) + eps)`` becomes
  ``SimplifiedLayerNormalization(x, ones)``.

Every rewrite is matched exactly (op types, attributes, constant values) or left alone;
:func:`check_rewrites` runs the fused blocks against the unfused graph's before it is published.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

MS = "com.microsoft"
FUSION_TOLERANCE = 1e-4  # a fused block's max error / its output's max magnitude (measured: ~1e-6)


@dataclass
class Rewrite:
    """One fused block: ``nodes`` replace the block that read ``inputs`` and wrote ``output``;
    inserted before ``anchor`` (the block's last node)."""

    kind: str
    inputs: list[str]
    output: str
    nodes: list[Any]
    anchor: Any


@dataclass
class FusionReport:
    """What :func:`fuse_for_cpu` rewrote: counts per fusion, and node counts before/after."""

    attention: int = 0
    rotary: int = 0
    rms_norm: int = 0
    nodes_before: int = 0
    nodes_after: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "attention": self.attention,
            "rotary_embedding": self.rotary,
            "rms_norm": self.rms_norm,
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "not_matched": dict(self.skipped),
        }


class _Graph:
    """Producer/consumer maps and constant lookup over an ONNX graph (one pass, then edits)."""

    def __init__(self, graph: Any) -> None:
        from onnx import numpy_helper

        self.graph = graph
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list[Any]] = defaultdict(list)
        for node in graph.node:
            for out in node.output:
                self.producer[out] = node
            for name in node.input:
                self.consumers[name].append(node)
        self.initializers = {t.name: t for t in graph.initializer}
        self.graph_outputs = {o.name for o in graph.output}
        self._to_array = numpy_helper.to_array
        self._from_array = numpy_helper.from_array
        self.removed: set[int] = set()
        self.rewrites: list[Rewrite] = []

    def add_initializer(self, array: Any, name: str) -> str:
        if name not in self.initializers:
            tensor = self._from_array(array, name)
            self.graph.initializer.append(tensor)
            self.initializers[name] = self.graph.initializer[-1]
        return name

    def const(self, name: str) -> Any:
        """The value of an initializer or Constant output, or None."""
        if name in self.initializers:
            return self._to_array(self.initializers[name])
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            return self._to_array(node.attribute[0].t)
        return None

    def op(self, name: str, op_type: str) -> Any:
        """The node producing ``name`` if it is a live ``op_type``, else None."""
        node = self.producer.get(name)
        if node is None or node.op_type != op_type or id(node) in self.removed:
            return None
        return node

    def only_consumer(self, name: str) -> Any:
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.graph_outputs:
            return None
        return users[0]

    def private(self, node: Any, *, allowed: set[int]) -> bool:
        """True when every output of ``node`` is read only by nodes in ``allowed`` (ids)."""
        return all(
            out not in self.graph_outputs and all(id(user) in allowed for user in self.consumers.get(out, []))
            for out in node.output
        )


def _attr(node: Any, name: str, default: Any = None) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _ints(value: Any) -> list[int] | None:
    if value is None:
        return None
    return [int(v) for v in value.ravel()]


@dataclass
class _Rope:
    x: str  # the un-rotated [B,S,N,D] input
    cos: Any  # [S, 1, D] table
    sin: Any
    nodes: list[Any]


def _match_rope(g: _Graph, out: str) -> _Rope | None:
    """``out = x*cos + concat(-x[..., D/2:], x[..., :D/2])*sin`` (rotate-half RoPE)."""
    add = g.op(out, "Add")
    if add is None:
        return None
    muls = [g.op(i, "Mul") for i in add.input]
    if any(m is None for m in muls):
        return None
    for plain, rotated in (muls, muls[::-1]):
        concat = next((g.op(i, "Concat") for i in rotated.input if g.op(i, "Concat") is not None), None)
        if concat is None or len(concat.input) != 2 or _attr(concat, "axis") not in (-1, 3):
            continue
        sin = next((g.const(i) for i in rotated.input if g.const(i) is not None), None)
        cos_name = next((i for i in plain.input if g.const(i) is not None), None)
        x = next((i for i in plain.input if g.const(i) is None), None)
        if sin is None or cos_name is None or x is None:
            continue
        neg = g.op(concat.input[0], "Neg")
        second = g.op(neg.input[0], "Slice") if neg is not None else None
        first = g.op(concat.input[1], "Slice")
        if second is None or first is None or second.input[0] != x or first.input[0] != x:
            continue
        cos = g.const(cos_name)
        if cos.ndim != 3 or cos.shape != sin.shape or cos.shape[1] != 1 or cos.shape[-1] % 2:
            continue
        half = cos.shape[-1] // 2
        if _slice(g, first) != (0, half) or _slice(g, second) not in ((half, cos.shape[-1]), (half, 2**63 - 1)):
            continue
        # rotate-half repeats the frequencies: the caches are the first half.
        if not ((cos[..., :half] == cos[..., half:]).all() and (sin[..., :half] == sin[..., half:]).all()):
            continue
        return _Rope(x, cos, sin, [add, plain, rotated, concat, neg, second, first])
    return None


def _slice(g: _Graph, node: Any) -> tuple[int, int] | None:
    """(start, end) of a Slice over the last axis (3) with step 1, else None."""
    ins = [_ints(g.const(i)) if i else None for i in node.input[1:]]
    ins += [None] * (4 - len(ins))
    starts, ends, axes, steps = ins
    if starts is None or ends is None or len(starts) != 1:
        return None
    if axes is not None and axes[0] not in (-1, 3):
        return None
    if steps is not None and steps[0] != 1:
        return None
    return starts[0], ends[0]


def _transpose_of(g: _Graph, name: str, perm: list[int]) -> str | None:
    node = g.op(name, "Transpose")
    if node is None or list(_attr(node, "perm", [])) != perm:
        return None
    return node.input[0]


def _fuse_attention(g: _Graph, softmax: Any, report: FusionReport) -> bool:
    """Rewrite one attention block around ``softmax`` (see the module docstring)."""
    import numpy as np
    from onnx import helper

    if _attr(softmax, "axis", -1) not in (-1, 3):
        return False
    scores = g.op(softmax.input[0], "FusedMatMul")
    if scores is None or any(_attr(scores, k, 0) for k in ("transA", "transB", "transBatchA", "transBatchB")):
        return False
    scale = float(_attr(scores, "alpha", 1.0))
    q_rot = _transpose_of(g, scores.input[0], [0, 2, 1, 3])
    k_rot = _transpose_of(g, scores.input[1], [0, 2, 3, 1])
    pv = g.only_consumer(softmax.output[0])
    if q_rot is None or k_rot is None or pv is None or pv.op_type != "MatMul" or pv.input[0] != softmax.output[0]:
        return False
    v = _transpose_of(g, pv.input[1], [0, 2, 1, 3])
    out_t = g.only_consumer(pv.output[0])
    if v is None or out_t is None or out_t.op_type != "Transpose" or list(_attr(out_t, "perm", [])) != [0, 2, 1, 3]:
        return False
    out_r = g.only_consumer(out_t.output[0])
    if out_r is None or out_r.op_type != "Reshape":
        return False
    rope_q, rope_k = _match_rope(g, q_rot), _match_rope(g, k_rot)
    if (rope_q is None) != (rope_k is None):
        return False
    q, k = (rope_q.x, rope_k.x) if rope_q and rope_k else (q_rot, k_rot)
    split = g.op(v, "Split")
    if split is None or list(split.output) != [q, k, v] or _attr(split, "axis") not in (2, -2):
        return False
    sizes = _ints(g.const(split.input[1])) if len(split.input) > 1 else None
    reshape = g.op(split.input[0], "Reshape")
    shape = _ints(g.const(reshape.input[1])) if reshape is not None else None
    if sizes is None or len(set(sizes)) != 1 or shape is None or len(shape) != 4 or shape[2] != 3 * sizes[0]:
        return False
    heads, head_dim = sizes[0], shape[3]
    out_shape = _ints(g.const(out_r.input[1]))
    if out_shape is None or out_shape[-1] not in (heads * head_dim, -1) or len(out_shape) != 3:
        return False
    if rope_q and rope_k:
        if not (
            np.array_equal(rope_q.cos, rope_k.cos)
            and np.array_equal(rope_q.sin, rope_k.sin)
            and rope_q.cos.shape[0] == shape[1]
            and rope_q.cos.shape[-1] == head_dim
        ):
            return False
    dead = [scores, softmax, pv, out_t, out_r, split, reshape]
    dead += [g.producer[n] for n in (scores.input[0], scores.input[1], pv.input[1])]
    dead += (rope_q.nodes + rope_k.nodes) if rope_q and rope_k else []
    allowed = {id(n) for n in dead}
    if not all(g.private(n, allowed=allowed) for n in dead if n is not out_r):
        return False

    prefix = out_r.name or out_r.output[0]
    width = heads * head_dim
    split_sizes = g.add_initializer(np.array([width] * 3, np.int64), f"{prefix}/fused_qkv_sizes")
    q3, k3, v3 = (f"{prefix}/fused_{n}" for n in "qkv")
    new = [
        helper.make_node("Split", [reshape.input[0], split_sizes], [q3, k3, v3], name=f"{prefix}/fused_split", axis=-1)
    ]
    if rope_q and rope_k:
        # [S, 1, D] tables -> [S, D/2] caches; position_ids [1] = offset 0: positions 0..S-1.
        half = head_dim // 2
        cos, sin = (
            g.add_initializer(np.ascontiguousarray(t[:, 0, :half], dtype=np.float32), f"{prefix}/fused_{kind}_cache")
            for kind, t in (("cos", rope_q.cos), ("sin", rope_q.sin))
        )
        offset = g.add_initializer(np.array([0], np.int64), "fused_rotary_position_offset")
        for src in (q3, k3):
            new.append(
                helper.make_node(
                    "RotaryEmbedding",
                    [src, offset, cos, sin],
                    [src + "_rot"],
                    name=f"{src}_rotary",
                    domain=MS,
                    interleaved=0,
                    num_heads=heads,
                    rotary_embedding_dim=head_dim,
                )
            )
        q3, k3 = q3 + "_rot", k3 + "_rot"
        report.rotary += 2
    new.append(
        helper.make_node(
            "MultiHeadAttention",
            [q3, k3, v3],
            [out_r.output[0]],
            name=f"{prefix}/fused_attention",
            domain=MS,
            num_heads=heads,
            scale=scale,
        )
    )
    g.removed.update(id(n) for n in dead)
    g.rewrites.append(Rewrite("attention", [reshape.input[0]], out_r.output[0], new, out_r))
    report.attention += 1
    return True


def _fuse_rms_norm(g: _Graph, div: Any, report: FusionReport, width: int) -> bool:
    """``x / sqrt(mean(x*x, -1) + eps)`` -> ``SimplifiedLayerNormalization(x, ones)``."""
    import numpy as np
    from onnx import helper

    x = div.input[0]
    sqrt = g.op(div.input[1], "Sqrt")
    add = g.op(sqrt.input[0], "Add") if sqrt is not None else None
    if add is None:
        return False
    mean_name = next((i for i in add.input if g.op(i, "ReduceMean") is not None), None)
    eps_name = next((i for i in add.input if g.const(i) is not None), None)
    if mean_name is None or eps_name is None:
        return False
    eps = g.const(eps_name)
    mean = g.op(mean_name, "ReduceMean")
    axes = _ints(g.const(mean.input[1])) if len(mean.input) > 1 else _ints(np.array(_attr(mean, "axes", [])))
    square = g.op(mean.input[0], "Mul")
    if (
        eps.size != 1
        or axes != [-1]
        or _attr(mean, "keepdims", 1) != 1
        or square is None
        or list(square.input) != [x, x]
    ):
        return False
    dead = [div, sqrt, add, mean, square]
    allowed = {id(n) for n in dead}
    if not all(g.private(n, allowed=allowed) for n in dead if n is not div):
        return False
    ones = g.add_initializer(np.ones(width, np.float32), f"fused_rms_scale_{width}")
    node = helper.make_node(
        "SimplifiedLayerNormalization",
        [x, ones],
        [div.output[0]],
        name=f"{div.name or div.output[0]}/fused_rms_norm",
        axis=-1,
        epsilon=float(eps.ravel()[0]),
        stash_type=1,
    )
    g.removed.update(id(n) for n in dead)
    g.rewrites.append(Rewrite("rms_norm", [x], div.output[0], [node], div))
    report.rms_norm += 1
    return True


def fuse_for_cpu(model: Any, hidden_size: int | None) -> tuple[FusionReport, list[Rewrite]]:
    """Rewrite ``model`` (an ORT-optimized HRM graph, in place) with the fusions above; returns
    what was fused and the rewrites, for :func:`check_rewrites`. ``hidden_size``: the model's
    (every HRM RMSNorm normalizes the hidden vector; the fused norm's unit scale has that size;
    None: norms are left alone)."""
    from onnx import helper

    g = _Graph(model.graph)
    report = FusionReport(nodes_before=len(model.graph.node))
    for node in list(model.graph.node):
        if node.op_type == "Softmax" and id(node) not in g.removed and not _fuse_attention(g, node, report):
            report.skipped["attention"] = report.skipped.get("attention", 0) + 1
    for node in list(model.graph.node):
        if hidden_size and node.op_type == "Div" and id(node) not in g.removed:
            _fuse_rms_norm(g, node, report, hidden_size)
    before = {id(r.anchor): r.nodes for r in g.rewrites}
    nodes = []
    for node in model.graph.node:
        nodes.extend(before.get(id(node), []))
        if id(node) not in g.removed:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = {name for node in nodes for name in node.input}
    kept = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    if g.rewrites and not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    report.nodes_after = len(nodes)
    return report, g.rewrites


TAPS_PER_KIND = {"attention": 4, "rms_norm": 2}  # tapped [1, S, hidden] tensors per block: QKV is 3


def check_rewrites(
    unfused: Any,
    fused: Any,
    rewrites: list[Rewrite],
    feed: dict[str, Any],
    threads: int | None,
    tensor_bytes: int = 0,
    budget_bytes: int = 2**30,
) -> tuple[float, int]:
    """Run the fused blocks on the inputs the unfused graph gave them (teacher forcing: no error
    is carried from block to block, so a chaotic random-weight model is held to the same limit
    as a trained one); returns the largest error relative to a block output's scale and how many
    blocks were checked. ``unfused``/``fused``: ONNX models (``fused`` supplies the initializers).

    The unfused graph is run once with the blocks' inputs and outputs as extra graph outputs,
    which ORT keeps until the run ends: every block is checked when those tensors
    (``tensor_bytes`` per [1, S, hidden] tensor) fit ``budget_bytes`` (the Sudoku-size unroll:
    about 0.5 GB), else an evenly spaced sample of each kind that fits."""
    import onnx
    from onnx import TensorProto, helper

    from hrm_deploy.onnx_runtime import Optimization, ort_session

    if not rewrites:
        return 0.0, 0
    need = sum(TAPS_PER_KIND.get(r.kind, 4) for r in rewrites) * tensor_bytes
    share = min(1.0, budget_bytes / need) if need else 1.0
    chosen = []
    for kind in dict.fromkeys(r.kind for r in rewrites):
        of_kind = [r for r in rewrites if r.kind == kind]
        keep = max(1, int(len(of_kind) * share))
        step = (len(of_kind) - 1) / max(keep - 1, 1)
        chosen += [of_kind[round(i * step)] for i in range(keep)] if keep < len(of_kind) else of_kind
    probe = onnx.ModelProto()
    probe.CopyFrom(unfused)
    known = {o.name for o in probe.graph.output}
    taps = list(dict.fromkeys(name for r in chosen for name in (*r.inputs, r.output)))
    probe.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in taps if n not in known)
    # The graph is ORT's already-optimized one: optimizing it again would only cost time.
    session = ort_session(probe.SerializeToString(), threads=threads, optimization=Optimization.DISABLED)
    del probe
    values = dict(zip(taps, session.run(taps, feed), strict=True))
    del session
    return _check_group(fused, chosen, values, threads), len(chosen)


def _check_group(fused: Any, rewrites: list[Rewrite], values: dict[str, Any], threads: int | None) -> float:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper

    from hrm_deploy.onnx_runtime import ort_session

    # One graph of the group's fused blocks side by side, each reading its tapped inputs.
    nodes, outputs = [], []
    for i, rewrite in enumerate(rewrites):
        made_here = {o for n in rewrite.nodes for o in n.output}
        for node in rewrite.nodes:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.output[:] = [f"check{i}/{out}" for out in copy.output]
            copy.input[:] = [f"check{i}/{name}" if name in made_here else name for name in copy.input]
            nodes.append(copy)
        outputs.append(f"check{i}/{rewrite.output}")
    inputs = sorted({n for r in rewrites for n in r.inputs})
    needed = {name for node in nodes for name in node.input}
    graph = helper.make_graph(
        nodes,
        "fusion_check",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [t for t in fused.graph.initializer if t.name in needed],
    )
    check = helper.make_model(graph, opset_imports=list(fused.opset_import))
    got = ort_session(check.SerializeToString(), threads=threads).run(outputs, {n: values[n] for n in inputs})
    worst = 0.0
    for rewrite, have in zip(rewrites, got, strict=True):
        want = values[rewrite.output]
        scale = max(float(np.abs(want).max()), 1e-6)
        worst = max(worst, float(np.abs(have - want).max()) / scale)
    return worst
