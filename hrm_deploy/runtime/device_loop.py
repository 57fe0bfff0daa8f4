"""The device loop: runs an engine (through an :mod:`adapter <hrm_deploy.runtime.adapter>`) on
one stream of a :class:`~hrm_deploy.runtime.memory.DeviceMemory`, for both engine modes.

Batches are padded up to a *bucket* (the next power of two within the engine's profile, padded
with copies of the last row and cut off again after), so a server that sees every batch size
from 1 to 1024 keeps at most 11 plans, and at most ``max_plans`` of them (least recently used
first out: its graph, events and buffers are released).

Per bucket, once (a *plan*): every device buffer and pinned host staging buffer is
allocated, input shapes are set (their bool checked), every tensor is bound and, for step
engines, two contexts are bound to ping-pong carry buffers (context 0 reads carry A and
writes carry B, context 1 the reverse), so a step changes no binding. The ``reset`` input
is one buffer whose *contents* switch (True for step 1, False after: a device copy).

Per call: inputs are staged into pinned memory and uploaded; then

- unrolled engine (or a loop engine: the ACT loop inside it, its steps_used passed on): one enqueue;
- step engine, no halting: the whole ``steps``-iteration loop, captured once as a CUDA graph
  (on the first call of a batch size, after one eager warm-up run) and replayed; if a capture
  fails (a backend that cannot be captured), the loop warns once with the reason, frees the
  partial graph and runs eagerly from then on (``path`` says which ran);
- step engine with ``halt``: an eager loop; after each step the q logits (2 x [B] floats)
  come to the host, ``halt(step, q_halt, q_continue)`` says which rows are done, their
  logits of that step are copied aside on the device, and the loop stops when all are done;

then outputs are downloaded. Per-step answers are reduced to their argmax on the device where
the memory backend can (torch): [steps, B, S] int32 cross to the host instead of
[steps, B, S, V] logits (``d2h_bytes`` in the timings counts what crossed). Copies, launches and timing events all go on the one stream:
``h2d_ms``/``compute_ms``/``d2h_ms`` come from events on that stream, and host work after the
download (argmax, widening to float32) is not in ``d2h_ms``. After warm-up a call makes no
allocation and no binding call.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hrm_deploy.contract import (
    CARRY,
    CARRY_OUT,
    FEEDS,
    HEADS,
    PUZZLE_ROWS,
    Q_LOGITS,
    RESET,
    STEP_INPUTS,
    STEP_OUTPUTS,
    STEPS_USED,
    HaltFn,
)
from hrm_deploy.errors import ConfigError, EngineError
from hrm_deploy.runtime.adapter import EngineAdapter, TensorSpec
from hrm_deploy.runtime.memory import DeviceMemory, to_float32

log = logging.getLogger(__name__)

# an unrolled engine needs these; q_continue_logits and step_predictions are used when present
UNROLLED_REQUIRED = HEADS[:2]
MAX_PLANS = 8  # plans (buffers, contexts, graphs) kept per loop; least recently used go first


def bucket(batch: int, low: int, high: int) -> int:
    """The plan size a batch of ``batch`` rows runs at: the next power of two, within ``low..high``."""
    size = 1 << max(0, int(batch) - 1).bit_length()
    return max(low, min(size, high))


def warm_sizes(low: int, high: int, max_batch: int | None = None) -> list[int]:
    """Every plan size (bucket) that batches of 1..``max_batch`` rows (default ``high``) run at."""
    top = min(high, max_batch or high)
    sizes = {bucket(1 << k, low, high) for k in range(max(1, top).bit_length()) if 1 << k <= top}
    return sorted(sizes | {bucket(top, low, high)})


@dataclass
class _Plan:
    batch: int
    contexts: list[Any]
    device: dict[str, Any]  # every device buffer by role
    stage: dict[str, np.ndarray]  # pinned host buffers by role
    events: list[Any]
    graph: Any = None
    extra: dict[str, Any] = field(default_factory=dict)  # a DeviceStep's per-step graphs


class DeviceLoop:
    """Drive ``adapter`` on ``memory``. ``steps`` is the ACT step count of a step engine (fixed
    by the graph for an unrolled one); ``cuda_graph`` captures the step loop; with
    ``step_predictions`` step engines return the per-step argmax (taken on the device where the
    memory backend can); ``buckets`` pads batches to powers of two (see the module docstring);
    ``max_plans`` bounds the plans kept."""

    def __init__(
        self,
        adapter: EngineAdapter,
        memory: DeviceMemory,
        steps: int | None = None,
        *,
        cuda_graph: bool = True,
        step_predictions: bool = True,
        buckets: bool = True,
        max_plans: int = MAX_PLANS,
    ):
        self.adapter, self.memory = adapter, memory
        names = set(adapter.tensors)
        self.mode = "step" if CARRY[0] in names else "unrolled"
        # the host feeds staged and uploaded: an external-table export takes the gathered rows
        self.feeds = (FEEDS[0], PUZZLE_ROWS) if PUZZLE_ROWS in names else FEEDS
        self.step_inputs = (*self.feeds, *STEP_INPUTS[len(FEEDS) :])
        wanted = set(self.step_inputs + STEP_OUTPUTS) if self.mode == "step" else set(self.feeds + UNROLLED_REQUIRED)
        if not wanted <= names:
            raise EngineError(
                f"this {self.mode} engine lacks tensors {sorted(wanted - names)}; rebuild it from an hrm-deploy export"
            )
        if self.mode == "unrolled":
            fixed = adapter.tensors["q_halt_logits"].shape[-1]
            if steps is not None and steps != fixed:
                raise ConfigError(
                    f"this unrolled engine always runs {fixed} ACT steps, not {steps}; export and "
                    "build a step engine (hrm-deploy export --mode step) to choose the step count"
                )
            self.steps = int(fixed)
        else:
            if steps is None or steps < 1:
                raise ConfigError("a step engine needs steps >= 1 (its manifest's steps, or pass steps=N)")
            self.steps = int(steps)
        self.cuda_graph = cuda_graph and memory.supports_graphs
        self.capture_error: str | None = None  # why capture failed, once it has (then eager for good)
        self.step_predictions = step_predictions
        # memory backends with a device argmax (torch, host); cuda-python has none: logits come back
        self._argmax: Callable[[Any, Any], None] | None = getattr(memory, "argmax", None)
        self.device_argmax = step_predictions and self._argmax is not None
        self.buckets, self.max_plans = buckets, max(1, int(max_plans))
        self.plans: OrderedDict[int, _Plan] = OrderedDict()
        self.enqueued_steps = 0  # engine executions so far (the overhead benchmark divides by it)

    @property
    def path(self) -> str:
        """How the step loop runs: ``cuda_graph``, ``eager`` or ``eager (capture failed: ...)``."""
        if self.mode == "unrolled":
            return "single enqueue"
        if self.capture_error:
            return f"eager (capture failed: {self.capture_error})"
        if getattr(self.adapter, "builtin_graphs", False):
            return "per-execute CUDA graphs (TensorRT-RTX)"
        return "cuda_graph" if self.cuda_graph else "eager"

    # -- plan: everything allocated and bound once per batch size -------------------------
    def _set_shapes(self, context: Any, batch: int, names: tuple[str, ...]) -> None:
        for name in names:
            shape = self.adapter.tensors[name].at(batch)
            if not self.adapter.set_input_shape(context, name, shape):
                low, high = self.adapter.batch_range
                raise EngineError(
                    f"the engine refused input {name} of shape {shape} (its profile takes batch "
                    f"{low}..{high}); rebuild with --max-batch or send smaller batches"
                )

    def _output(self, context: Any, spec: TensorSpec) -> Any:
        shape = self.adapter.output_shape(context, spec.name)
        if any(d < 0 for d in shape):
            raise EngineError(f"the engine could not infer the shape of {spec.name} ({shape}); input shapes unset")
        return self.memory.empty(shape, spec.dtype)

    def plan(self, batch: int, keep: _Plan | None = None) -> _Plan:
        """The plan of ``batch`` rows (made on first use); the least recently used plans go
        first when ``max_plans`` are held, never ``keep`` (a plan whose buffers still hold a carry)."""
        if batch in self.plans:
            self.plans.move_to_end(batch)
            return self.plans[batch]
        while len(self.plans) >= self.max_plans:
            oldest = next((b for b, p in self.plans.items() if p is not keep), None)
            if oldest is None:
                break
            self._release(self.plans.pop(oldest))
        adapter, memory, specs = self.adapter, self.memory, self.adapter.tensors
        low, high = adapter.batch_range
        if not low <= batch <= high:
            raise EngineError(f"batch {batch} is outside the engine's profile {low}..{high}")  # the Runner chunks
        n_contexts = 2 if self.mode == "step" else 1
        contexts = [adapter.new_context() for _ in range(n_contexts)]
        inputs = self.step_inputs if self.mode == "step" else self.feeds
        for context in contexts:
            self._set_shapes(context, batch, inputs)
        device: dict[str, Any] = {name: memory.empty(specs[name].at(batch), specs[name].dtype) for name in inputs}
        stage = {name: memory.staging(specs[name].at(batch), specs[name].dtype) for name in self.feeds}
        scratch = max(adapter.scratch_bytes(c) for c in contexts)
        if scratch:
            device["scratch"] = memory.empty((scratch,), "bool")
        for context in contexts:
            adapter.set_scratch(context, device.get("scratch"), scratch)
        outputs = [s for s in specs.values() if not s.is_input]
        for spec in outputs:
            device[spec.name] = self._output(contexts[0], spec)
        if self.mode == "step":
            for name in CARRY:
                device[name + "_b"] = memory.empty(specs[name].at(batch), specs[name].dtype)
            reset = specs[RESET]
            for role, value in (("reset_on", True), ("reset_off", False)):
                device[role] = memory.empty(reset.at(batch), reset.dtype)
                host = memory.staging(reset.at(batch), reset.dtype)
                host[...] = value
                memory.upload(device[role], host)
                stage[role] = host  # kept alive: the copy is asynchronous
            for name in Q_LOGITS:
                spec = specs[name]
                device[name + "_hist"] = memory.empty((self.steps, batch), spec.dtype)
                stage[name + "_hist"] = memory.staging((self.steps, batch), spec.dtype)
                stage[name] = memory.staging((batch,), spec.dtype)
            logits = specs["logits"]
            shape = self.adapter.output_shape(contexts[0], "logits")
            device["final"] = memory.empty(shape, logits.dtype)
            stage["logits"] = memory.staging(shape, logits.dtype)
            if self.device_argmax:  # [steps, B, S] int32 answers, reduced on the device
                device["pred_hist"] = memory.empty((self.steps, *shape[:-1]), "int32")
                stage["pred_hist"] = memory.staging((self.steps, *shape[:-1]), "int32")
            elif self.step_predictions:  # no device argmax (cuda-python): every step's logits come back
                device["logits_hist"] = memory.empty((self.steps, *shape), logits.dtype)
                stage["logits_hist"] = memory.staging((self.steps, *shape), logits.dtype)
            carry_a = {name: device[name] for name in CARRY}
            carry_b = {name: device[name + "_b"] for name in CARRY}
            for context, (src, dst) in zip(contexts, ((carry_a, carry_b), (carry_b, carry_a))):
                for name in (*self.feeds, RESET):
                    adapter.bind(context, name, device[name])
                for name, out in zip(CARRY, CARRY_OUT):
                    adapter.bind(context, name, src[name])
                    adapter.bind(context, out, dst[name])
                for name in HEADS:
                    adapter.bind(context, name, device[name])
        else:
            for name in [*self.feeds, *(s.name for s in outputs)]:
                adapter.bind(contexts[0], name, device[name])
            for spec in outputs:
                stage[spec.name] = memory.staging(self.adapter.output_shape(contexts[0], spec.name), spec.dtype)
        memory.synchronize()
        plan = _Plan(batch, contexts, device, stage, [memory.new_event() for _ in range(4)])
        self.plans[batch] = plan
        return plan

    def _release(self, plan: _Plan) -> None:
        """Free one plan: its graph and contexts first (they use the scratch buffer), then events and buffers."""
        self.memory.synchronize()
        plan.graph = None
        plan.extra.clear()  # per-step graphs of a DeviceStep
        plan.contexts.clear()
        plan.events.clear()
        for buffer in plan.device.values():
            self.memory.free(buffer)
        plan.device.clear()
        for host in plan.stage.values():  # pinned host memory goes with its plan
            self.memory.free_staging(host)
        plan.stage.clear()

    def close(self) -> None:
        """Drop every plan."""
        for plan in self.plans.values():
            self._release(plan)
        self.plans.clear()

    # -- the step loop ---------------------------------------------------------------------
    def _step(self, plan: _Plan, k: int) -> None:
        """Enqueue ACT step ``k`` (0-based): reset switch, one execute, per-step outputs aside."""
        memory, device = self.memory, plan.device
        if k < 2:
            memory.copy(device[RESET], device["reset_on" if k == 0 else "reset_off"])
        self.adapter.execute(plan.contexts[k % 2])
        self.enqueued_steps += 1
        for name in Q_LOGITS:
            memory.copy(memory.rows(device[name + "_hist"], k, k + 1), device[name])
        if self.device_argmax and self._argmax is not None:
            self._argmax(memory.rows(device["pred_hist"], k, k + 1), device["logits"])
        elif self.step_predictions:
            memory.copy(memory.rows(device["logits_hist"], k, k + 1), device["logits"])

    def _all_steps(self, plan: _Plan) -> None:
        for k in range(self.steps):
            self._step(plan, k)

    def _halting(self, plan: _Plan, halt: HaltFn, rows: int) -> tuple[int, np.ndarray]:
        """The eager loop with a host decision per step; ``rows`` real rows (the rest of the
        bucket is padding, done from the start, never shown to ``halt``)."""
        memory, device, stage, batch = self.memory, plan.device, plan.stage, plan.batch
        done = np.arange(batch) >= rows
        used = np.zeros(batch, np.int32)
        specs = self.adapter.tensors
        k = 0
        for k in range(self.steps):
            self._step(plan, k)
            for name in Q_LOGITS:
                memory.download(stage[name], device[name])
            memory.synchronize()  # the only host sync per step: 2 x B floats
            q_halt = to_float32(stage["q_halt_logits"], specs["q_halt_logits"].dtype)
            q_continue = to_float32(stage["q_continue_logits"], specs["q_continue_logits"].dtype)
            stop = np.asarray(halt(k + 1, q_halt[:rows], q_continue[:rows]))
            if stop.shape != (rows,) or stop.dtype != np.bool_:
                raise ConfigError(
                    f"the halt rule must return a bool array of shape ({rows},), got {stop.dtype} {stop.shape}"
                )
            new = np.concatenate([stop, np.zeros(batch - rows, bool)]) & ~done
            self._freeze(plan, new)
            used[new] = k + 1
            done |= new
            if done.all():
                break
        done[rows:] = False  # padding rows: their (unused) answers from the last step run
        self._freeze(plan, ~done)
        used[~done] = k + 1
        return k + 1, used

    def _freeze(self, plan: _Plan, rows: np.ndarray) -> None:
        """Copy the current logits of ``rows`` into the final buffer (one copy per run of rows)."""
        if not rows.any():
            return
        memory, device = self.memory, plan.device
        edges = np.flatnonzero(np.diff(np.concatenate([[0], rows.astype(np.int8), [0]])))
        for start, stop in zip(edges[::2], edges[1::2]):
            memory.copy(
                memory.rows(device["final"], int(start), int(stop)),
                memory.rows(device["logits"], int(start), int(stop)),
            )

    # -- one call ------------------------------------------------------------------------------
    def capture(self, work: Callable[[], None], what: str) -> Any:
        """A graph of ``work`` (which the caller has just run eagerly, so its outputs exist), or None
        when the capture fails: then warn once with the reason, stay eager for good, and run ``work``
        again eagerly (nothing of a failed capture is trusted)."""
        try:
            self.memory.synchronize()
            return self.memory.capture(work)
        except Exception as exc:  # noqa: BLE001 - backends raise many types; the reason is kept and shown
            reason = f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
            self.capture_error, self.cuda_graph = reason, False
            log.warning("CUDA graph capture of %s failed (%s); running it eagerly from now on", what, reason)
            try:
                self.memory.synchronize()
            finally:
                work()
            return None

    def _capture(self, plan: _Plan) -> None:
        """Capture the step loop of ``plan`` as its graph (see :meth:`capture`)."""
        before = self.enqueued_steps
        plan.graph = self.capture(lambda: self._all_steps(plan), "the step loop")
        if plan.graph is not None:
            self.enqueued_steps = before  # captured, not run

    def stage_feeds(self, plan: _Plan, feeds: dict[str, np.ndarray], rows: int) -> None:
        """``feeds`` ([rows, ...] each) into the plan's pinned host buffers, the rest of the bucket
        padded with copies of the last row (uploading them is the caller's: it times the copy)."""
        for name in self.feeds:
            np.copyto(plan.stage[name][:rows], feeds[name], casting="unsafe")
            plan.stage[name][rows:] = plan.stage[name][rows - 1 : rows]

    def run(
        self, feeds: dict[str, np.ndarray], halt: HaltFn | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Outputs (host numpy, float32 logits) and phase timings of one batch (within the profile)."""
        if halt is not None and self.mode != "step":
            if STEPS_USED in self.adapter.tensors:
                raise ConfigError(
                    "this is a loop engine: it halts by the rule fixed at its export; run it without --halt, or "
                    "export --mode loop --halt RULE (or --mode step) and build that"
                )
            raise ConfigError(
                "early halting needs a step engine (its loop can stop); this engine is unrolled: "
                "export --mode step and build that"
            )
        rows = len(feeds["inputs"])
        low, high = self.adapter.batch_range
        plan = self.plan(bucket(rows, low, high) if self.buckets and low <= rows <= high else rows)
        memory, device, stage, specs = self.memory, plan.device, plan.stage, self.adapter.tensors
        wall = time.perf_counter()
        memory.reset_peak()
        down = 0
        with memory.on_stream():
            self.stage_feeds(plan, feeds, rows)
            e_begin, e_uploaded, e_computed, e_done = plan.events
            memory.record(e_begin)
            for name in self.feeds:
                memory.upload(device[name], stage[name])
            memory.record(e_uploaded)
            steps_run = self.steps
            used = np.full(plan.batch, self.steps, np.int32)
            if self.mode == "unrolled":
                self.adapter.execute(plan.contexts[0])
                self.enqueued_steps += 1
                downloads = [s.name for s in specs.values() if not s.is_input]
            else:
                if halt is not None:
                    steps_run, used = self._halting(plan, halt, rows)
                    final = device["final"]
                elif plan.graph is not None:
                    memory.replay(plan.graph)
                    final = device["logits"]
                else:
                    self._all_steps(plan)  # eager; on the first call also the warm-up before capture
                    final = device["logits"]
                    if self.cuda_graph and all(self.adapter.capturable(c) for c in plan.contexts):
                        self._capture(plan)
                downloads = ["q_halt_logits_hist", "q_continue_logits_hist"]
                downloads += ["pred_hist"] if self.device_argmax else ["logits_hist"] if self.step_predictions else []
            memory.record(e_computed)
            if self.mode == "step":
                memory.download(stage["logits"], final)
                down += stage["logits"].nbytes
            for name in downloads:
                memory.download(stage[name], device[name])
                down += stage[name].nbytes
            memory.record(e_done)
            memory.synchronize()
        timing: dict[str, Any] = {
            "h2d_ms": memory.elapsed_ms(e_begin, e_uploaded),
            "compute_ms": memory.elapsed_ms(e_uploaded, e_computed),
            "d2h_ms": memory.elapsed_ms(e_computed, e_done),
            "h2d_bytes": sum(stage[name].nbytes for name in self.feeds),
            "d2h_bytes": down,
        }
        peak = memory.peak_bytes()
        timing["peak_gpu_mib"] = peak / 2**20 if peak else None
        out = self._outputs(plan, steps_run, used)
        if plan.batch != rows:
            out = {k: v[:rows] for k, v in out.items()}
        timing["wall_ms"] = (time.perf_counter() - wall) * 1e3
        return out, timing

    def _outputs(self, plan: _Plan, steps_run: int, used: np.ndarray) -> dict[str, np.ndarray]:
        stage, specs = plan.stage, self.adapter.tensors
        if self.mode == "unrolled":
            out = {
                "logits": to_float32(stage["logits"], specs["logits"].dtype),
                "q_halt_logits": to_float32(stage["q_halt_logits"], specs["q_halt_logits"].dtype),
            }
            if "q_continue_logits" in stage:
                out["q_continue_logits"] = to_float32(stage["q_continue_logits"], specs["q_continue_logits"].dtype)
            if "step_predictions" in stage:
                out["step_predictions"] = stage["step_predictions"].astype(np.int32)
            if STEPS_USED in stage:  # a loop engine: the ACT loop inside it said where each row stopped
                used = stage[STEPS_USED].astype(np.int32).copy()
        else:
            out = {"logits": to_float32(stage["logits"], specs["logits"].dtype)}
            for name in Q_LOGITS:
                out[name] = to_float32(stage[name + "_hist"][:steps_run], specs[name].dtype).T.copy()
            predictions = None
            if self.device_argmax:
                predictions = stage["pred_hist"][:steps_run].transpose(1, 0, 2).astype(np.int32)
            elif self.step_predictions:
                hist = to_float32(stage["logits_hist"][:steps_run], specs["logits"].dtype)
                predictions = hist.argmax(-1).astype(np.int32).transpose(1, 0, 2).copy()
            if predictions is not None:
                for row in np.flatnonzero(used < steps_run):  # a halted row's answer stays its halting step's
                    predictions[row, used[row] :] = predictions[row, used[row] - 1]
                out["step_predictions"] = predictions
        out["steps_used"] = used
        return out
