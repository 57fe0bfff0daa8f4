"""The device loop: runs an engine (through an :mod:`adapter <hrm_deploy.runners.adapter>`) on
one stream of a :class:`~hrm_deploy.runners.memory.DeviceMemory`, for both engine modes.

Per batch size, once (a *plan*): every device buffer and pinned host staging buffer is
allocated, input shapes are set (their bool checked), every tensor is bound and, for step
engines, two contexts are bound to ping-pong carry buffers (context 0 reads carry A and
writes carry B, context 1 the reverse), so a step changes no binding. The ``reset`` input
is one buffer whose *contents* switch (True for step 1, False after: a device copy).

Per call: inputs are staged into pinned memory and uploaded; then

- unrolled engine: one enqueue;
- step engine, no halting: the whole ``steps``-iteration loop, captured once as a CUDA graph
  (on the first call of a batch size, after one eager warm-up run) and replayed;
- step engine with ``halt``: an eager loop; after each step the q logits (2 x [B] floats)
  come to the host, ``halt(step, q_halt, q_continue)`` says which rows are done, their
  logits of that step are copied aside on the device, and the loop stops when all are done;

then outputs are downloaded. Copies, launches and timing events all go on the one stream:
``h2d_ms``/``compute_ms``/``d2h_ms`` come from events on that stream, and host work after the
download (argmax, widening to float32) is not in ``d2h_ms``. After warm-up a call makes no
allocation and no binding call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hrm_deploy.errors import ConfigError, EngineError
from hrm_deploy.runners.adapter import EngineAdapter, TensorSpec
from hrm_deploy.runners.memory import DeviceMemory, to_float32

HaltFn = Callable[[int, np.ndarray, np.ndarray], np.ndarray]
FEEDS = ("inputs", "puzzle_identifiers")
STEP_INPUTS = (*FEEDS, "z_H", "z_L", "reset")
STEP_OUTPUTS = ("z_H_out", "z_L_out", "logits", "q_halt_logits", "q_continue_logits")
UNROLLED_OUTPUTS = ("logits", "q_halt_logits")  # + q_continue_logits, step_predictions when present


@dataclass
class _Plan:
    batch: int
    contexts: list[Any]
    device: dict[str, Any]  # every device buffer by role
    stage: dict[str, np.ndarray]  # pinned host buffers by role
    events: list[Any]
    graph: Any = None
    warm: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class DeviceLoop:
    """Drive ``adapter`` on ``memory``. ``steps`` is the ACT step count of a step engine (fixed
    by the graph for an unrolled one); ``cuda_graph`` captures the step loop; with
    ``step_predictions`` step engines keep each step's logits on the device and return the
    per-step argmax."""

    def __init__(
        self,
        adapter: EngineAdapter,
        memory: DeviceMemory,
        steps: int | None = None,
        *,
        cuda_graph: bool = True,
        step_predictions: bool = True,
    ):
        self.adapter, self.memory = adapter, memory
        names = set(adapter.tensors)
        self.mode = "step" if "z_H" in names else "unrolled"
        wanted = set(STEP_INPUTS + STEP_OUTPUTS) if self.mode == "step" else set(FEEDS + UNROLLED_OUTPUTS)
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
        self.step_predictions = step_predictions
        self.plans: dict[int, _Plan] = {}
        self.enqueued_steps = 0  # engine executions so far (the overhead benchmark divides by it)

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

    def plan(self, batch: int) -> _Plan:
        if batch in self.plans:
            return self.plans[batch]
        adapter, memory, specs = self.adapter, self.memory, self.adapter.tensors
        low, high = adapter.batch_range
        if not low <= batch <= high:
            raise EngineError(f"batch {batch} is outside the engine's profile {low}..{high}")  # the Runner chunks
        n_contexts = 2 if self.mode == "step" else 1
        contexts = [adapter.new_context() for _ in range(n_contexts)]
        inputs = STEP_INPUTS if self.mode == "step" else FEEDS
        for context in contexts:
            self._set_shapes(context, batch, inputs)
        device: dict[str, Any] = {name: memory.empty(specs[name].at(batch), specs[name].dtype) for name in inputs}
        stage = {name: memory.staging(specs[name].at(batch), specs[name].dtype) for name in FEEDS}
        scratch = max(adapter.scratch_bytes(c) for c in contexts)
        if scratch:
            device["scratch"] = memory.empty((scratch,), "bool")
        for context in contexts:
            adapter.set_scratch(context, device.get("scratch"), scratch)
        outputs = [s for s in specs.values() if not s.is_input]
        for spec in outputs:
            device[spec.name] = self._output(contexts[0], spec)
        if self.mode == "step":
            for name in ("z_H", "z_L"):
                device[name + "_b"] = memory.empty(specs[name].at(batch), specs[name].dtype)
            reset = specs["reset"]
            for role, value in (("reset_on", True), ("reset_off", False)):
                device[role] = memory.empty(reset.at(batch), reset.dtype)
                host = memory.staging(reset.at(batch), reset.dtype)
                host[...] = value
                memory.upload(device[role], host)
                stage[role] = host  # kept alive: the copy is asynchronous
            for name in ("q_halt_logits", "q_continue_logits"):
                spec = specs[name]
                device[name + "_hist"] = memory.empty((self.steps, batch), spec.dtype)
                stage[name + "_hist"] = memory.staging((self.steps, batch), spec.dtype)
                stage[name] = memory.staging((batch,), spec.dtype)
            logits = specs["logits"]
            shape = self.adapter.output_shape(contexts[0], "logits")
            device["final"] = memory.empty(shape, logits.dtype)
            stage["logits"] = memory.staging(shape, logits.dtype)
            if self.step_predictions:
                device["logits_hist"] = memory.empty((self.steps, *shape), logits.dtype)
                stage["logits_hist"] = memory.staging((self.steps, *shape), logits.dtype)
            carry_a = {"z_H": device["z_H"], "z_L": device["z_L"]}
            carry_b = {"z_H": device["z_H_b"], "z_L": device["z_L_b"]}
            for context, (src, dst) in zip(contexts, ((carry_a, carry_b), (carry_b, carry_a))):
                for name in FEEDS + ("reset",):
                    adapter.bind(context, name, device[name])
                for name in ("z_H", "z_L"):
                    adapter.bind(context, name, src[name])
                    adapter.bind(context, name + "_out", dst[name])
                for name in ("logits", "q_halt_logits", "q_continue_logits"):
                    adapter.bind(context, name, device[name])
        else:
            for name in [*FEEDS, *(s.name for s in outputs)]:
                adapter.bind(contexts[0], name, device[name])
            for spec in outputs:
                stage[spec.name] = memory.staging(self.adapter.output_shape(contexts[0], spec.name), spec.dtype)
        memory.synchronize()
        plan = _Plan(batch, contexts, device, stage, [memory.new_event() for _ in range(4)])
        self.plans[batch] = plan
        return plan

    def close(self) -> None:
        """Drop every plan: contexts first (they use the scratch buffer), then the buffers."""
        self.memory.synchronize()
        for plan in self.plans.values():
            plan.contexts.clear()
            plan.graph = None
            for buffer in plan.device.values():
                self.memory.free(buffer)
        self.plans.clear()

    # -- the step loop ---------------------------------------------------------------------
    def _step(self, plan: _Plan, k: int) -> None:
        """Enqueue ACT step ``k`` (0-based): reset switch, one execute, per-step outputs aside."""
        memory, device = self.memory, plan.device
        if k < 2:
            memory.copy(device["reset"], device["reset_on" if k == 0 else "reset_off"])
        self.adapter.execute(plan.contexts[k % 2])
        self.enqueued_steps += 1
        for name in ("q_halt_logits", "q_continue_logits"):
            memory.copy(memory.rows(device[name + "_hist"], k, k + 1), device[name])
        if self.step_predictions:
            memory.copy(memory.rows(device["logits_hist"], k, k + 1), device["logits"])

    def _all_steps(self, plan: _Plan) -> None:
        for k in range(self.steps):
            self._step(plan, k)

    def _halting(self, plan: _Plan, halt: HaltFn) -> tuple[int, np.ndarray]:
        memory, device, stage, batch = self.memory, plan.device, plan.stage, plan.batch
        done = np.zeros(batch, bool)
        used = np.zeros(batch, np.int32)
        specs = self.adapter.tensors
        k = 0
        for k in range(self.steps):
            self._step(plan, k)
            for name in ("q_halt_logits", "q_continue_logits"):
                memory.download(stage[name], device[name])
            memory.synchronize()  # the only host sync per step: 2 x B floats
            q_halt = to_float32(stage["q_halt_logits"], specs["q_halt_logits"].dtype)
            q_continue = to_float32(stage["q_continue_logits"], specs["q_continue_logits"].dtype)
            stop = np.asarray(halt(k + 1, q_halt, q_continue))
            if stop.shape != (batch,) or stop.dtype != np.bool_:
                raise ConfigError(
                    f"the halt rule must return a bool array of shape ({batch},), got {stop.dtype} {stop.shape}"
                )
            new = stop & ~done
            self._freeze(plan, new)
            used[new] = k + 1
            done |= new
            if done.all():
                break
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
    def run(
        self, feeds: dict[str, np.ndarray], halt: HaltFn | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Outputs (host numpy, float32 logits) and phase timings of one batch (within the profile)."""
        if halt is not None and self.mode != "step":
            raise ConfigError(
                "early halting needs a step engine (its loop can stop); this engine is unrolled: "
                "export --mode step and build that"
            )
        batch = len(feeds["inputs"])
        plan = self.plan(batch)
        memory, device, stage, specs = self.memory, plan.device, plan.stage, self.adapter.tensors
        wall = time.perf_counter()
        memory.reset_peak()
        with memory.on_stream():
            for name in FEEDS:
                np.copyto(stage[name], feeds[name], casting="unsafe")
            e_begin, e_uploaded, e_computed, e_done = plan.events
            memory.record(e_begin)
            for name in FEEDS:
                memory.upload(device[name], stage[name])
            memory.record(e_uploaded)
            steps_run = self.steps
            used = np.full(batch, self.steps, np.int32)
            if self.mode == "unrolled":
                self.adapter.execute(plan.contexts[0])
                self.enqueued_steps += 1
                downloads = [s.name for s in specs.values() if not s.is_input]
            else:
                if halt is not None:
                    steps_run, used = self._halting(plan, halt)
                    final = device["final"]
                elif plan.graph is not None:
                    memory.replay(plan.graph)
                    final = device["logits"]
                else:
                    self._all_steps(plan)  # eager; on the first call also the warm-up before capture
                    final = device["logits"]
                    if self.cuda_graph and all(self.adapter.capturable(c) for c in plan.contexts):
                        memory.synchronize()
                        plan.graph = memory.capture(lambda: self._all_steps(plan))
                        self.enqueued_steps -= self.steps  # captured, not run
                downloads = ["q_halt_logits_hist", "q_continue_logits_hist"] + (
                    ["logits_hist"] if self.step_predictions else []
                )
            memory.record(e_computed)
            if self.mode == "step":
                memory.download(stage["logits"], final)
            for name in downloads:
                memory.download(stage[name], device[name])
            memory.record(e_done)
            memory.synchronize()
        timing: dict[str, Any] = {
            "h2d_ms": memory.elapsed_ms(e_begin, e_uploaded),
            "compute_ms": memory.elapsed_ms(e_uploaded, e_computed),
            "d2h_ms": memory.elapsed_ms(e_computed, e_done),
        }
        peak = memory.peak_bytes()
        timing["peak_gpu_mib"] = peak / 2**20 if peak else None
        out = self._outputs(plan, steps_run, used)
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
        else:
            out = {"logits": to_float32(stage["logits"], specs["logits"].dtype)}
            for name in ("q_halt_logits", "q_continue_logits"):
                out[name] = to_float32(stage[name + "_hist"][:steps_run], specs[name].dtype).T.copy()
            if self.step_predictions:
                hist = to_float32(stage["logits_hist"][:steps_run], specs["logits"].dtype)
                predictions = hist.argmax(-1).astype(np.int32).transpose(1, 0, 2).copy()
                for row in np.flatnonzero(used < steps_run):  # a halted row's answer stays its halting step's
                    predictions[row, used[row] :] = predictions[row, used[row] - 1]
                out["step_predictions"] = predictions
        out["steps_used"] = used
        return out
