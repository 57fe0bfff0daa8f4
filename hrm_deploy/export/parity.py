"""Parity of an exported graph against the PyTorch reference on ONNX Runtime (CPU).

Recurrence amplifies rounding: an untrained HRM is chaotic over 16 steps, so two float32
implementations of it legitimately disagree end to end. The check is therefore per ACT step
(teacher-forced): PyTorch float32 runs a segment from the carry the graph produced one step
earlier, and the graph must match it within the limits of :mod:`hrm_deploy.export.parity_limits`
(1e-4 of the output scale, scaled with the step's depth and float32's variation on this machine),
for random and trained weights alike. Steps 0, 1 and the last of an unrolled graph are compared numerically; every other copy of
the segment is proven node-for-node identical to step 0. Graphs whose per-step tensors cannot be
read (external weights) are compared end to end, falling back to the float64 noise floor.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from hrm_deploy.contract import CARRY
from hrm_deploy.errors import ParityError
from hrm_deploy.export.parity_limits import ABS_FLOOR, NOISE_FACTOR, Float32Noise, TensorDiff, by_argmax, judge
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.onnx_runtime import ort_session, run_stepwise

STEP_TOLERANCE = 1e-3  # one segment, no recurrence: error relative to max(1, |ref|)


@dataclass
class ParityReport:
    passed: bool
    batches: dict[str, dict] = field(default_factory=dict)
    segment: dict | None = None
    message: str = ""
    method: str = "teacher-forced per step"  # or "end to end" (graphs with external weights)
    checked_steps: list[int] = field(default_factory=list)  # ACT steps compared per step

    def to_dict(self) -> dict:
        return asdict(self)


def sample_inputs(config: HRMConfig, batch: int, seed: int) -> dict[str, np.ndarray]:
    """Deterministic valid token and puzzle ids (int32, the graphs' input dtype)."""
    rng = np.random.default_rng(seed)
    return {
        "inputs": rng.integers(0, config.vocab_size, size=(batch, config.seq_len), dtype=np.int32),
        "puzzle_identifiers": rng.integers(0, config.num_puzzle_identifiers, size=(batch,), dtype=np.int32),
    }


def _torch_outputs(module, feeds) -> dict[str, np.ndarray]:
    import torch

    with torch.inference_mode():
        out = module(torch.from_numpy(feeds["inputs"]), torch.from_numpy(feeds["puzzle_identifiers"]))
    names = ("logits", "q_halt_logits", "q_continue_logits")
    return {n: t.double().numpy() for n, t in zip(names, out)}


def float64_twin(core):
    """A float64 copy of an HRMCore (the noise-floor reference)."""
    import torch

    twin = copy.deepcopy(core).double()
    twin.compute_dtype = torch.float64
    return twin


def check_segment(step_model_bytes: bytes, core, batch: int = 2, seed: int = 7) -> dict:
    """One traced ACT segment vs PyTorch: no recurrence, so the tolerance is tight."""
    feeds = sample_inputs(core.config, batch, seed)
    x, z_H0, z_L0 = _embed(core, feeds)
    # A non-trivial carry: one segment in, so the checked segment sees realistic states.
    z_H, z_L = (a.astype(np.float32) for a in _segment_references(core, x, [(z_H0, z_L0)])[0][:2])
    ref = _segment_references(core, x, [(z_H, z_L)])[0]
    got = ort_session(step_model_bytes).run(None, {CARRY[0]: z_H, CARRY[1]: z_L, "x": x.numpy()})
    report = {}
    for name, g, r in zip((*CARRY, "logits", "q_halt", "q_continue"), got, ref):
        diff = TensorDiff.of(g, r)
        report[name] = asdict(diff)
        if diff.max_abs > STEP_TOLERANCE * max(1.0, float(np.abs(r).max(initial=0.0))):
            raise ParityError(
                f"one traced ACT segment differs from PyTorch: {name} max abs error {diff.max_abs:.3g} "
                f"(tolerance {STEP_TOLERANCE:g} x scale); the export is wrong, please report it"
            )
    return report


# Steps whose outputs are compared numerically: the first two (the embedding, the carry hand-off)
# and the last (the output head). Every other copy of the unroll is checked to be node-for-node
# the same as step 0 (:func:`check_unroll_structure`), so it computes the same function of its
# carry; a graph of at most this many steps is checked at every step.
SAMPLED_STEPS = 3


@dataclass(frozen=True)
class ParityPlan:
    """What the parity session of an unrolled graph computes: ``checked`` steps' carries and q
    logits (``carry_outputs``/``q_outputs`` by step) plus the final logits. With ``cut`` set,
    step ``cut``'s carry input (``cut_inputs``) is fed from outside, so steps between 1 and
    ``cut`` are not run at all."""

    model_bytes: bytes
    checked: tuple[int, ...]
    cut: int | None
    cut_inputs: tuple[str, str] | None
    carry_outputs: dict[int, tuple[str, str]]
    q_outputs: dict[int, tuple[str, str]]


def _carry(step: int) -> tuple[str, str]:
    return f"step{step}/z_H_out", f"step{step}/z_L_out"


def plan_unrolled_parity(model, steps: int) -> ParityPlan | None:
    """The unrolled graph ``model`` (an ``onnx.ModelProto``, weights inline) cut down to the sampled steps (all of them when
    ``steps <= SAMPLED_STEPS``), their per-step tensors added as outputs, serialized for a parity
    session; None when the graph keeps its weights outside (protobuf's 2 GiB limit) or lacks the
    per-step tensors."""
    from onnx import TensorProto, helper

    from hrm_deploy.export.graph import prune_dead_nodes

    if any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer):
        return None
    last = steps - 1
    checked = tuple(range(steps)) if steps <= SAMPLED_STEPS else (0, 1, last)
    cut = last if steps > SAMPLED_STEPS else None
    produced = {o for n in model.graph.node for o in n.output}
    carries = {i: _carry(i) for i in checked if all(n in produced for n in _carry(i))}
    q_names = {i: (f"step{i}/q_halt_col", f"step{i}/q_continue_col") for i in checked}
    cut_inputs = _carry(cut - 1) if cut is not None else None
    needed = [n for i in checked[:-1] for n in (*_carry(i), *q_names[i])] + list(q_names[last])
    if not all(n in produced for n in needed + list(cut_inputs or ())):
        return None  # the last carry is pruned when no output needs it, so it is optional
    graph = model.graph
    nodes = list(graph.node)
    if cut_inputs is not None:  # the producers of the cut carry go; it becomes a graph input
        nodes = [n for n in nodes if not set(n.output) & set(cut_inputs)]
    outputs = ["logits", *(n for i in checked for n in (*carries.get(i, ()), *q_names[i]))]
    nodes = prune_dead_nodes(nodes, outputs)
    used = {i for n in nodes for i in n.input}
    inputs = [i for i in graph.input if i.name in used]
    if cut_inputs is not None:
        inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in cut_inputs]
    sampled = helper.make_graph(
        nodes,
        graph.name + "_parity",
        inputs,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        initializer=[t for t in graph.initializer if t.name in used],
    )
    parity_model = helper.make_model(sampled, opset_imports=list(model.opset_import))
    parity_model.ir_version = model.ir_version
    return ParityPlan(parity_model.SerializeToString(), checked, cut, cut_inputs, carries, q_names)


def check_unroll_structure(graph, steps: int) -> None:
    """Every copy of the segment in the unrolled ``graph`` (an ``onnx.GraphProto``) except the last is node for
    node the same as step 0 (same ops, attributes and shared weights), reading the carry step
    ``i - 1`` wrote; the per-step q outputs are concatenated in step order. Together with the
    numeric check of the sampled steps this covers every step. Raises :class:`ParityError`."""
    import onnx

    copies: dict[int, list[onnx.NodeProto]] = {i: [] for i in range(steps)}
    for node in graph.node:
        head = node.name.split("/", 1)[0]
        if head.startswith("step") and head[4:].isdigit() and int(head[4:]) in copies:
            copies[int(head[4:])].append(node)
    first_carry = ("embed/z_H0", "embed/z_L0")

    def signature(i: int) -> list[tuple]:
        carry_in = dict(zip(first_carry if i == 0 else _carry(i - 1), ("@carry_H", "@carry_L")))
        own = f"step{i}/"

        def norm(name: str) -> str:
            return "@/" + name[len(own) :] if name.startswith(own) else carry_in.get(name, name)

        return [
            (
                n.op_type,
                n.domain,
                tuple(map(norm, n.input)),
                tuple(map(norm, n.output)),
                tuple(a.SerializeToString() for a in n.attribute),
            )
            for n in copies[i]
        ]

    reference = signature(0)
    for i in range(1, steps - 1):
        got = signature(i)
        if got != reference:
            where = next((k for k, (a, b) in enumerate(zip(got, reference)) if a != b), min(len(got), len(reference)))
            node = copies[i][where].name if where < len(copies[i]) else f"(node count {len(got)} vs {len(reference)})"
            raise ParityError(
                f"ACT step {i} of the unrolled graph is not a copy of step 0 (first difference at {node}); "
                "the export is wrong, please report it"
            )
    for output, key in (("q_halt_logits", "q_halt_col"), ("q_continue_logits", "q_continue_col")):
        concat = next((n for n in graph.node if output in n.output), None)
        if concat is None or list(concat.input) != [f"step{i}/{key}" for i in range(steps)]:
            raise ParityError(f"{output} does not concatenate the {steps} ACT steps in order; please report it")


def _segment_references(core, x, carries_in: list) -> list[tuple[np.ndarray, ...]]:
    """PyTorch float32 runs one ACT segment from each carry in ``carries_in`` (all [B,T,D]) in
    one batched call (large GEMMs are far cheaper per row on a CPU than many small ones);
    returns per carry (z_H, z_L, logits, q_halt, q_continue) as float64 arrays."""
    import torch

    from hrm_deploy.export.unroll import StepCore

    def tensor(a):
        return a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))

    batch = x.shape[0]
    with torch.inference_mode():
        z_H = torch.cat([tensor(c[0]) for c in carries_in])
        z_L = torch.cat([tensor(c[1]) for c in carries_in])
        outs = StepCore(core)(z_H, z_L, x.repeat(len(carries_in), *([1] * (x.dim() - 1))))
    return [tuple(t[k * batch : (k + 1) * batch].double().numpy() for t in outs) for k in range(len(carries_in))]


def _embed(core, feeds):
    import torch

    from hrm_deploy.export.unroll import EmbedInit

    with torch.inference_mode():
        return EmbedInit(core)(torch.from_numpy(feeds["inputs"]), torch.from_numpy(feeds["puzzle_identifiers"]))


def _run_sampled(
    session, plan: ParityPlan, core, feeds
) -> tuple[dict[int, tuple], dict[int, tuple], np.ndarray, tuple]:
    """One ONNX Runtime run of the parity graph and PyTorch's teacher-forced references:
    step 0 from the initial carry, step ``i`` from the carry the graph produced at ``i - 1``,
    the cut step from PyTorch's own step-0 carry (a realistic state). Returns (got, ref, logits)
    with got[i] = (z_H, z_L, q_halt, q_continue) (carry None where the graph has none) and
    ref[i] = (z_H, z_L, logits, q_halt, q_continue); and (x, the carry each step started from)."""
    x, z_H0, z_L0 = _embed(core, feeds)
    ref: dict[int, tuple] = {0: _segment_references(core, x, [(z_H0, z_L0)])[0]}
    extra = {}
    if plan.cut is not None and plan.cut_inputs is not None:
        extra = {name: ref[0][k].astype(np.float32) for k, name in enumerate(plan.cut_inputs)}
    names = ["logits"]
    for i in plan.checked:
        names += [*plan.carry_outputs.get(i, ()), *plan.q_outputs[i]]
    values = dict(zip(names, session.run(names, {**feeds, **extra})))
    got = {}
    for i in plan.checked:
        carry = tuple(values[n] for n in plan.carry_outputs[i]) if i in plan.carry_outputs else (None, None)
        got[i] = (*carry, *(values[n][:, 0] for n in plan.q_outputs[i]))
    later = [i for i in plan.checked if i > 0]
    carries_in = [
        tuple(extra[n] for n in plan.cut_inputs) if i == plan.cut and plan.cut_inputs else got[i - 1][:2] for i in later
    ]
    if carries_in:
        ref.update(zip(later, _segment_references(core, x, carries_in)))
    starts = {0: (z_H0, z_L0), **dict(zip(later, carries_in))}
    return got, ref, values["logits"], (x, starts)


def _run_step_graph(session, core, config: HRMConfig, feeds, steps: int):
    """The single-step graph driven for ``steps`` calls from a reset, each step teacher-forced in
    PyTorch from the carry the graph produced one call earlier. Same return as :func:`_run_sampled`."""
    states: list = []
    out = run_stepwise(session, feeds, config, steps, states)
    x, z_H0, z_L0 = _embed(core, feeds)
    refs = _segment_references(core, x, [(z_H0, z_L0), *states[:-1]])
    got = {i: (*states[i], out["q_halt_logits"][:, i], out["q_continue_logits"][:, i]) for i in range(steps)}
    starts = dict(enumerate([(z_H0, z_L0), *states[:-1]]))
    return got, dict(enumerate(refs)), out["logits"], (x, starts)


def check_parity(
    path: str,
    reference_module,
    config: HRMConfig,
    steps: int,
    batches: tuple[int, ...],
    stepwise: bool = False,
    seed: int = 0,
    advance: Callable[[int], None] | None = None,
    puzzle_table=None,
) -> ParityReport:
    """Compare the ONNX graph at ``path`` with PyTorch float32 (``reference_module`` is a
    FixedStepHRM) at each batch size, step by step (teacher forcing); ``advance(1)`` after each
    batch size (a :func:`hrm_deploy.progress.progress` display).

    Each checked ACT step of the graph is compared with PyTorch running that segment from the
    carry the graph produced one step earlier: z_H, z_L, q_halt and q_continue of the step and the
    final logits must be within the limits of :mod:`hrm_deploy.export.parity_limits` (1e-4 of the
    output scale at HRM's depth, growing with the step's depth; else float32's own variation on this
    machine; argmax agreement decides within a small band). No recurrence amplifies rounding, so a
    chaotic random-weight model and a trained one are held to the same limits with no float64 reference. The checked steps are the first two and the last of an unrolled
    graph (the others are proven copies of step 0 by :func:`check_unroll_structure`), or the first
    two calls of a single-step graph; a full-size export checks in seconds, not minutes.
    Unrolled graphs whose per-step tensors cannot be read (external weights) fall back to
    :func:`check_parity_end_to_end`. A graph that takes ``puzzle_emb_rows`` gets them gathered
    from ``puzzle_table`` (a :class:`~hrm_deploy.puzzle_table.PuzzleTable`)."""
    core = reference_module.step.core
    plan = None
    if stepwise:
        session = _parity_session(path, puzzle_table)
        checked: tuple[int, ...] = tuple(range(min(steps, 2)))
    else:
        import onnx

        model = onnx.load(path, load_external_data=False)  # read once for both checks below
        plan = plan_unrolled_parity(model, steps)
        if plan is None:
            return check_parity_end_to_end(
                path, reference_module, config, steps, batches, stepwise, seed, advance, puzzle_table
            )
        check_unroll_structure(model.graph, steps)
        del model
        session = _parity_session(plan.model_bytes, puzzle_table)
        checked = plan.checked
    last = checked[-1]
    report = ParityReport(passed=True)
    report.checked_steps = list(checked)
    failures = []
    for batch in batches:
        feeds = sample_inputs(config, batch, seed + batch)
        if plan is None:
            got, ref, logits, starts = _run_step_graph(session, core, config, feeds, len(checked))
        else:
            got, ref, logits, starts = _run_sampled(session, plan, core, feeds)
        per_step = {  # steps whose carry the graph does not expose (the unused last one) are skipped
            CARRY[0]: [(i, got[i][0], ref[i][0]) for i in checked if got[i][0] is not None],
            CARRY[1]: [(i, got[i][1], ref[i][1]) for i in checked if got[i][1] is not None],
            "q_halt_logits": [(i, got[i][2], ref[i][3]) for i in checked],
            "q_continue_logits": [(i, got[i][3], ref[i][4]) for i in checked],
            "logits": [(last, logits, ref[last][2])],
        }
        noise = Float32Noise(lambda x, carries: _segment_references(core, x, carries), starts, ref)
        entry = {name: judge(name, triples, config, noise) for name, triples in per_step.items()}
        by_argmax(entry)
        for name, verdict in entry.items():
            if not verdict["passed"]:
                failures.append(
                    f"batch {batch} {name} at ACT step {verdict['worst_step']}: max abs {verdict['max_abs']:.3g} vs "
                    f"PyTorch float32 from the same carry (limit {verdict['limit']:.3g}: {verdict['limit_from']})"
                )
        report.batches[str(batch)] = entry
        if advance:
            advance(1)
    return _concluded(report, failures)


def _parity_session(source, puzzle_table=None):
    """An ORT session for the parity check that does not spin its threads between runs: the
    check alternates ORT and PyTorch, and spinning ORT threads starve PyTorch's OpenMP threads
    (4x slower PyTorch on 2 cores, measured). With a table it takes identifiers like the runners."""
    session = ort_session(source, spinning=False)
    if puzzle_table is None:
        return session
    from hrm_deploy.puzzle_table import RowsSession

    return RowsSession(session, puzzle_table)


def _concluded(report: ParityReport, failures: list[str]) -> ParityReport:
    """``report`` failed (with every failure in its message) when there are any."""
    if failures:
        report.passed = False
        report.message = "; ".join(failures)
    return report


def check_parity_end_to_end(
    path: str,
    reference_module,
    config: HRMConfig,
    steps: int,
    batches: tuple[int, ...],
    stepwise: bool = False,
    seed: int = 0,
    advance: Callable[[int], None] | None = None,
    puzzle_table=None,
) -> ParityReport:
    """End-to-end comparison with PyTorch float32, falling back to the float64 noise floor
    when the strict limit is missed (a chaotic model). Slower than :func:`check_parity` on
    random weights (the float64 reference); used where the per-step carry cannot be read."""
    from hrm_deploy.export.unroll import FixedStepHRM

    session = _parity_session(path, puzzle_table)
    twin = None  # the float64 reference is built only when the cheap strict check is not enough
    report = ParityReport(passed=True, method="end to end")
    failures = []
    names = ("logits", "q_halt_logits", "q_continue_logits")
    for batch in batches:
        feeds = sample_inputs(config, batch, seed + batch)
        if stepwise:
            got = run_stepwise(session, feeds, config, steps)
        else:
            got = dict(zip(names, session.run(None, feeds)))
        ref32 = _torch_outputs(reference_module, feeds)
        diffs = {n: TensorDiff.of(got[n], ref32[n], argmax=n == "logits") for n in names}
        scales = {n: max(1.0, float(np.abs(ref32[n]).max(initial=0.0))) for n in names}
        strict_ok = all(diffs[n].max_abs <= ABS_FLOOR * scales[n] for n in names)
        ref64 = None
        if not strict_ok:
            if twin is None:
                twin = FixedStepHRM(float64_twin(reference_module.step.core), steps).eval()
            ref64 = _torch_outputs(twin, feeds)
        entry = {}
        for name in names:
            entry[name] = {**asdict(diffs[name]), "strict_limit": ABS_FLOOR * scales[name]}
            if ref64 is None:
                entry[name]["passed"] = True
                continue
            vs64 = TensorDiff.of(got[name], ref64[name]).max_abs
            noise = TensorDiff.of(ref32[name], ref64[name]).max_abs
            limit = NOISE_FACTOR * noise + ABS_FLOOR * scales[name]
            ok = vs64 <= limit
            entry[name].update(max_abs_vs_float64=vs64, torch_float32_noise=noise, limit=limit, passed=ok)
            if not ok:
                failures.append(
                    f"batch {batch} {name}: max abs {diffs[name].max_abs:.3g} vs PyTorch "
                    f"(vs float64 {vs64:.3g} > limit {limit:.3g})"
                )
        report.batches[str(batch)] = entry
        if advance:
            advance(1)
    return _concluded(report, failures)
