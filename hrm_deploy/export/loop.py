"""The ACT loop inside the graph (``export --mode loop``): one call per answer, early exit included.

The step graph needs a driver (our host or device loop) between ACT segments; the unrolled graph
always runs every step. The loop graph wraps the same traced segment in an ONNX ``Loop`` (TensorRT's
parser maps it to an ``ILoop``) whose condition is "some row has not halted", so an application,
``trtexec`` or Triton's own backends run it alone, and a batch stops as soon as its last row halts.

The halting rule is fixed at export (:class:`LoopHalt`, recorded in the graph's metadata and the
manifest): ``off`` (every step: equal to the unrolled graph), ``q`` (the family's training rule:
``q_halt > q_continue`` for HRM, ``q_halt > 0`` for TRM), ``threshold:X`` (``sigmoid(q_halt) > X``);
the last step always halts. A halted row is frozen by masks: its logits, step count and q logits
stay those of its halting step, which is what the host loop (``hrm_deploy.halting.drive``)
returns. Rows never interact inside a segment, so a row's answer does not depend on its batch-mates.

Graph (B batch, S seq_len, V vocab, N steps at most)::

    inputs [B, S] int32, puzzle_identifiers [B] int32
      -> logits [B, S, V] (each row's halting step), q_halt_logits [B, N], q_continue_logits [B, N]
         (NaN after a row's halting step, as the host loop gives them), steps_used [B] int32

Body of the ``Loop`` (carried: z_H, z_L, halted, steps_used, logits; scanned: q_halt, q_continue)::

    step = iter + 1;  (z_H, z_L, logits', q_halt, q_continue) = segment(z_H, z_L, x)
    live = not halted
    logits = where(live, logits', logits);  steps_used = where(live, step, steps_used)
    halted = halted or rule(q_halt, q_continue) or step >= N;  cond = any(not halted)

The segment's weights stay in the outer graph (a body may read outer-scope values), so they are
stored once, as in the other modes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hrm_deploy.contract import CARRY, CARRY_OUT, FEEDS, PUZZLE_ROWS, STEPS_USED, UNROLLED_INPUTS
from hrm_deploy.errors import ConfigError

LOOP_HALT_MODES = ("off", "q", "threshold")


@dataclass(frozen=True)
class LoopHalt:
    """The halting rule a loop graph tests after each step (fixed at export).

    ``q_halt_only``: the ``q`` rule compares ``q_halt`` with 0 (TRM's training rule) instead of with
    ``q_continue`` (HRM's). ``min_steps``: no row halts by the rule before this step."""

    mode: str = "off"
    threshold: float | None = None
    q_halt_only: bool = False
    min_steps: int = 1

    @classmethod
    def parse(cls, text: str | None, *, q_halt_only: bool, min_steps: int = 1) -> LoopHalt:
        """``off`` | ``q`` | ``threshold:X`` (0 < X < 1), as ``--halt`` reads them at run time; a rule
        that needs host state (``budget:P``, calibrated on the host per artifact) is refused in one
        line naming the alternatives."""
        text = (text or "off").strip().lower()
        name, _, arg = text.partition(":")
        if name == "budget":
            raise ConfigError(
                f"--halt {text}: a budget rule is calibrated on the host per artifact and cannot be fixed in a "
                "loop graph; export --mode loop --halt threshold:X (the threshold verify calibrates) or --mode step"
            )
        threshold = None
        if name == "threshold":
            try:
                threshold = float(arg)
            except ValueError:
                threshold = math.nan
            if not 0.0 < threshold < 1.0:
                raise ConfigError(f"--halt {text!r}: threshold:X needs 0 < X < 1")
        elif name not in ("off", "q") or arg:
            raise ConfigError(f"--halt {text!r}: a loop graph takes off, q or threshold:X (0 < X < 1)")
        if min_steps < 1:
            raise ConfigError(f"--min-steps must be >= 1, got {min_steps}")
        return cls(name, threshold, q_halt_only and name == "q", min_steps)

    @property
    def text(self) -> str:
        return f"threshold:{self.threshold:g}" if self.mode == "threshold" else self.mode

    @property
    def bound(self) -> float | None:
        """What ``q_halt`` must exceed to halt (None: ``q_continue``, HRM's q rule)."""
        if self.mode == "threshold":
            return _logit(float(self.threshold or 0.5))
        return 0.0 if self.mode == "q" and self.q_halt_only else None

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.text, "q_halt_only": self.q_halt_only, "min_steps": self.min_steps}

    def should_halt(self, step: int, q_halt: Any, q_continue: Any, total_steps: int) -> Any:
        """The rows that stop after ``step`` (1-based) of ``total_steps``: bool [B], as the host loop
        decides with the same rule (:meth:`hrm_deploy.halting.HaltRule.should_halt`)."""
        import numpy as np

        q_halt = np.asarray(q_halt, dtype=np.float32)
        if self.mode == "off":
            rule = np.zeros(q_halt.shape, dtype=bool)
        else:
            rule = q_halt > (np.asarray(q_continue, dtype=np.float32) if self.bound is None else self.bound)
        return (rule & (step >= self.min_steps)) | (step >= total_steps)


def assemble_loop(
    embed: Any, step: Any, cfg: Any, steps: int, halt: LoopHalt, io_spec: dict[str, Any], external: bool = False
) -> Any:
    """The loop graph from the two traced pieces (see the module text) with the I/O ``io_spec``
    (``export.onnx_export``'s contract of mode ``loop``); returns the ONNX model."""
    import onnx
    from onnx import TensorProto, helper

    from hrm_deploy.export.graph import GraphBuilder, value_info
    from hrm_deploy.export.trace import INITIAL_CARRY

    b = GraphBuilder.empty()
    embed_names = b.add_initializers(embed.graph.initializer, "embed/")
    step_names = b.add_initializers(step.graph.initializer, "step/")
    feeds = (FEEDS[0], PUZZLE_ROWS) if external else UNROLLED_INPUTS
    e = b.inline(embed.graph, "embed/", {n: n for n in feeds}, embed_names)

    def scalar(name: str, dtype: int, value: float | int | bool) -> str:
        b.initializers.setdefault(name, helper.make_tensor(name, dtype, [], [value]))
        return name

    # ---- the loop's starting state: nothing halted, no step used, zero logits; shapes from the batch
    batch = "loop_init/batch"  # int64 [1]
    b.node("Shape", [FEEDS[0]], ["loop_init/input_shape"], "loop_init/Shape")
    b.node(
        "Slice",
        ["loop_init/input_shape", b.constant("const/zero_1", [0]), b.constant("const/one_1", [1])],
        [batch],
        "loop_init/Slice",
    )
    sv = b.constant("const/seq_vocab", [cfg.seq_len, cfg.vocab_size])
    b.node("Concat", [batch, sv], ["loop_init/logits_shape"], "loop_init/Concat", axis=0)

    def filled(shape: str, name: str, dtype: int, value: float | int | bool) -> str:
        b.node(
            "ConstantOfShape",
            [shape],
            [name],
            f"{name}/ConstantOfShape",
            value=helper.make_tensor("value", dtype, [1], [value]),
        )
        return name

    start = {
        "halted": filled(batch, "loop_init/halted", TensorProto.BOOL, False),
        STEPS_USED: filled(batch, "loop_init/steps_used", TensorProto.INT32, 0),
        "logits": filled("loop_init/logits_shape", "loop_init/logits", TensorProto.FLOAT, 0.0),
    }

    # ---- the body: one segment, the rule, the masks
    body = GraphBuilder([], b.initializers)  # constants land in the outer graph, read from the body
    p = "loop/"
    carried = [*CARRY, "halted", STEPS_USED, "logits"]
    o = body.inline(step.graph, f"{p}step/", {CARRY[0]: p + CARRY[0], CARRY[1]: p + CARRY[1], "x": e["x"]}, step_names)
    body.node("Add", [p + "iter", scalar("const/loop_one", TensorProto.INT64, 1)], [p + "step64"], f"{p}Add_step")
    body.node("Cast", [p + "step64"], [p + "step"], f"{p}Cast_step", to=TensorProto.INT32)
    body.node("Not", [p + "halted"], [p + "live"], f"{p}Not_halted")
    body.node("Unsqueeze", [p + "live", b.constant("const/axes_1_2", [1, 2])], [p + "live3"], f"{p}Unsqueeze_live")
    body.node("Where", [p + "live3", o["logits"], p + "logits"], [p + "logits_out"], f"{p}Where_logits")
    body.node("Where", [p + "live", p + "step", p + STEPS_USED], [p + "steps_out"], f"{p}Where_steps")
    nan = scalar("const/nan", TensorProto.FLOAT, math.nan)
    for key in ("q_halt", "q_continue"):  # per step; NaN once a row has halted (the host loop's convention)
        body.node("Where", [p + "live", o[key], nan], [f"{p}{key}_scan"], f"{p}Where_{key}")
    # the rule, then the last step, then the rows already halted
    trip = scalar("const/loop_steps", TensorProto.INT64, steps)
    body.node("GreaterOrEqual", [p + "step64", trip], [p + "last"], f"{p}GreaterOrEqual_last")
    stop = p + "last"
    if halt.mode != "off":
        if halt.bound is None:
            body.node("Greater", [o["q_halt"], o["q_continue"]], [p + "rule"], f"{p}Greater_rule")
        else:  # q_halt > 0 (TRM's q rule), or sigmoid(q_halt) > X  <=>  q_halt > logit(X)
            bound = halt.bound
            body.node(
                "Greater",
                [o["q_halt"], scalar("const/halt_bound", TensorProto.FLOAT, bound)],
                [p + "rule"],
                f"{p}Greater_rule",
            )
        rule = p + "rule"
        if halt.min_steps > 1:
            minimum = scalar("const/loop_min_steps", TensorProto.INT64, halt.min_steps)
            body.node("GreaterOrEqual", [p + "step64", minimum], [p + "past_min"], f"{p}GreaterOrEqual_min")
            body.node("And", [rule, p + "past_min"], [p + "rule_min"], f"{p}And_min")
            rule = p + "rule_min"
        body.node("Or", [rule, p + "last"], [p + "stop"], f"{p}Or_stop")
        stop = p + "stop"
    body.node("Or", [p + "halted", stop], [p + "halted_out"], f"{p}Or_halted")
    body.node("Not", [p + "halted_out"], [p + "running"], f"{p}Not_running")
    body.node("Cast", [p + "running"], [p + "running_i"], f"{p}Cast_running", to=TensorProto.INT32)
    body.node("ReduceMax", [p + "running_i"], [p + "any_running"], f"{p}ReduceMax_running", keepdims=0)
    body.node("Cast", [p + "any_running"], [p + "cond_out"], f"{p}Cast_cond", to=TensorProto.BOOL)
    for name, out in zip(CARRY, CARRY_OUT):
        body.node("Identity", [o[out]], [f"{p}{name}_out"], f"{p}Identity_{name}")

    hidden = ("batch", cfg.total_seq_len, cfg.hidden_size)
    types = {
        CARRY[0]: (TensorProto.FLOAT, hidden),
        CARRY[1]: (TensorProto.FLOAT, hidden),
        "halted": (TensorProto.BOOL, ("batch",)),
        STEPS_USED: (TensorProto.INT32, ("batch",)),
        "logits": (TensorProto.FLOAT, ("batch", cfg.seq_len, cfg.vocab_size)),
    }
    body_out = {
        CARRY[0]: f"{p}z_H_out",
        CARRY[1]: f"{p}z_L_out",
        "halted": p + "halted_out",
        STEPS_USED: p + "steps_out",
        "logits": p + "logits_out",
    }
    body_graph = helper.make_graph(
        body.nodes,
        "hrm_act_step",
        [
            value_info(p + "iter", TensorProto.INT64, []),
            value_info(p + "cond", TensorProto.BOOL, []),
            *(value_info(p + n, *types[n]) for n in carried),
        ],
        [
            value_info(p + "cond_out", TensorProto.BOOL, []),
            *(value_info(body_out[n], *types[n]) for n in carried),
            *(value_info(f"{p}{key}_scan", TensorProto.FLOAT, ("batch",)) for key in ("q_halt", "q_continue")),
        ],
    )
    finals = [f"loop_out/{n}" for n in carried]
    b.node(
        "Loop",
        [
            trip,
            scalar("const/true", TensorProto.BOOL, True),
            e[INITIAL_CARRY[0]],
            e[INITIAL_CARRY[1]],
            start["halted"],
            start[STEPS_USED],
            start["logits"],
        ],
        [*finals, "loop_out/q_halt", "loop_out/q_continue"],
        "loop/Loop",
        body=body_graph,
    )
    b.node("Identity", ["loop_out/logits"], ["logits"], "output/logits")
    b.node("Identity", [f"loop_out/{STEPS_USED}"], [STEPS_USED], f"output/{STEPS_USED}")
    # scan outputs are [n, B] for the n steps the batch ran: padded with NaN to [N, B] (a row's
    # columns must not depend on its batch-mates), then [B, N] as in the other graphs
    b.node("Shape", ["loop_out/q_halt"], ["loop_out/ran_shape"], "loop_out/Shape")
    b.node(
        "Slice",
        ["loop_out/ran_shape", b.constant("const/zero_1", [0]), b.constant("const/one_1", [1])],
        ["loop_out/ran"],
        "loop_out/Slice_ran",
    )
    b.node("Sub", [b.constant("const/loop_steps_1", [steps]), "loop_out/ran"], ["loop_out/missing"], "loop_out/Sub")
    zeros_2 = b.constant("const/zeros_2", [0, 0])
    b.node(
        "Concat",
        [zeros_2, "loop_out/missing", b.constant("const/zero_1", [0])],
        ["loop_out/pads"],
        "loop_out/Concat_pads",
        axis=0,
    )
    for key in ("q_halt", "q_continue"):
        b.node(
            "Pad",
            [f"loop_out/{key}", "loop_out/pads", nan],
            [f"loop_out/{key}_padded"],
            f"loop_out/Pad_{key}",
            mode="constant",
        )
        b.node("Transpose", [f"loop_out/{key}_padded"], [f"{key}_logits"], f"output/{key}_logits", perm=[1, 0])

    used = {i for n in b.nodes for i in n.input} | {i for n in body.nodes for i in n.input}
    graph = helper.make_graph(
        b.nodes,
        "hrm_loop",
        [value_info(n, *spec) for n, spec in io_spec["inputs"].items()],
        [value_info(n, *spec) for n, spec in io_spec["outputs"].items()],
        initializer=[t for name, t in b.initializers.items() if name in used],
    )
    model = helper.make_model(graph, opset_imports=list(step.opset_import), producer_name="hrm-deploy")
    model.ir_version = step.ir_version
    onnx.checker.check_model(model)  # a malformed body is our bug: keep its traceback
    return model


# Rows whose deciding q logit lies this close to the rule's bound may halt one step apart between
# the loop graph and the host loop (two float32 programs); any other difference is a bug.
BOUNDARY = 1e-4
LOOP_TOLERANCE = 1e-5  # x output scale: the same kernels on the same shapes, masks only select


def check_loop_parity(
    loop_source: Any,
    step_source: Any,
    cfg: Any,
    halt: LoopHalt,
    batches: tuple[int, ...],
    steps: int,
    seed: int = 0,
    puzzle_table: Any = None,
) -> dict[str, Any]:
    """The loop graph against the host loop over the step graph of the same segment, both on ONNX
    Runtime CPU, with the same rule: each row's step count must be equal (a row whose deciding q
    logit is within :data:`BOUNDARY` of the rule's bound excepted), its logits within
    :data:`LOOP_TOLERANCE` of the scale and its argmax equal. The step graph itself is held to
    PyTorch by the export's per-step parity check. Returns the report; raises
    :class:`~hrm_deploy.errors.ParityError` naming the first difference."""
    import numpy as np

    from hrm_deploy.errors import ParityError
    from hrm_deploy.export.parity import sample_inputs
    from hrm_deploy.onnx_runtime import ort_session
    from hrm_deploy.puzzle_table import RowsSession

    def session(source: Any) -> Any:  # no spinning threads; identifiers in, rows gathered where external
        made = ort_session(source, spinning=False)
        return made if puzzle_table is None else RowsSession(made, puzzle_table)

    loop, step = session(loop_source), session(step_source)
    report: dict[str, Any] = {
        "method": "loop graph vs host loop over the step graph (ONNX Runtime CPU)",
        "halt": halt.to_dict(),
        "batches": {},
    }
    for batch in batches:
        feeds = sample_inputs(cfg, batch, seed + batch)
        names = ("logits", "q_halt_logits", "q_continue_logits", STEPS_USED)
        got = dict(zip(names, loop.run(list(names), feeds)))
        host = host_loop(step, feeds, halt, steps)
        same = got[STEPS_USED] == host[STEPS_USED]
        for row in np.flatnonzero(~same):  # only a near-tie of the rule may move a row's halting step
            first = int(min(got[STEPS_USED][row], host[STEPS_USED][row])) - 1
            margin = _margin(halt, host["q_halt_logits"][row, first], host["q_continue_logits"][row, first])
            if margin > BOUNDARY:
                raise ParityError(
                    f"loop graph: row {row} of a batch of {batch} halted at step {got[STEPS_USED][row]}, the host loop "
                    f"at step {host[STEPS_USED][row]} (q margin {margin:.3g}); the export is wrong, please report it"
                )
        scale = max(1.0, float(np.abs(host["logits"]).max(initial=0.0)))
        diff = float(np.abs(got["logits"][same] - host["logits"][same]).max(initial=0.0))
        agree = float((got["logits"][same].argmax(-1) == host["logits"][same].argmax(-1)).mean()) if same.any() else 1.0
        q_same = bool(
            np.allclose(
                got["q_halt_logits"][same], host["q_halt_logits"][same], atol=LOOP_TOLERANCE * scale, equal_nan=True
            )
        )
        report["batches"][str(batch)] = {
            "logits_max_abs": diff,
            "argmax_agreement": agree,
            "rows_same_steps": int(same.sum()),
            "rows": batch,
            "steps_run": int(got[STEPS_USED].max(initial=0)),
            "q_logits_equal": q_same,
        }
        if diff > LOOP_TOLERANCE * scale or agree < 1.0 or not q_same:
            raise ParityError(
                f"loop graph differs from the host loop at batch {batch}: logits max abs {diff:.3g}, argmax agreement "
                f"{agree:.2%}, q logits equal: {q_same}; the export is wrong, please report it"
            )
    report["passed"] = True
    return report


def host_loop(session: Any, feeds: dict[str, Any], halt: LoopHalt, steps: int) -> dict[str, Any]:
    """The host loop's answers over a step graph's session with ``halt``: each row's logits of its
    halting step, q logits per step (NaN after it), steps used; every row runs every step until the
    batch is done (rows never interact, so this is what a compacting host loop gives)."""
    import numpy as np

    from hrm_deploy.onnx_runtime import step_once, zero_carry

    batch = len(feeds["inputs"])
    carry = zero_carry(session, batch)
    live = np.ones(batch, dtype=bool)
    out: dict[str, Any] = {
        "q_halt_logits": np.full((batch, steps), np.nan, np.float32),
        "q_continue_logits": np.full((batch, steps), np.nan, np.float32),
        STEPS_USED: np.zeros(batch, np.int32),
    }
    for i in range(steps):
        carry, (logits, q_halt, q_continue), _ = step_once(session, feeds, carry, np.full((batch,), i == 0, bool))
        if i == 0:
            out["logits"] = np.zeros_like(logits)
        out["logits"][live] = logits[live]
        out["q_halt_logits"][live, i] = q_halt[live]
        out["q_continue_logits"][live, i] = q_continue[live]
        out[STEPS_USED][live] = i + 1
        live &= ~halt.should_halt(i + 1, q_halt, q_continue, steps)
        if not live.any():
            break
    return out


def _margin(halt: LoopHalt, q_halt: float, q_continue: float) -> float:
    """How far a step's q logits are from flipping ``halt``'s decision (inf for ``off``)."""
    if halt.mode == "off":
        return math.inf
    return abs(float(q_halt) - (float(q_continue) if halt.bound is None else halt.bound))


def _logit(p: float) -> float:
    p = min(max(p, 1e-12), 1 - 1e-12)
    return math.log(p / (1 - p))
