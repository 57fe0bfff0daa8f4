"""ACT driver (Triton Python backend): puzzles in, answers out, over a single-step model.

Runs the ACT loop over a step model (ONNX or TensorRT plan) with BLS calls. The carry
``z_H``/``z_L`` [B, S + prefix, hidden] starts from the model's initial carry (``reset`` = True on a
row's first step); up to ``steps`` ACT steps. Halting rule (parameter ``halt``): ``off`` runs every
step (upstream's evaluation), ``q`` stops a puzzle when ``q_halt > q_continue`` (upstream HRM's rule;
``q0``: ``q_halt > 0``, the rule of models trained without the continue logit, written for ``--halt q``
of such a model), ``threshold:X`` when ``sigmoid(q_halt) > X`` (the rules of hrm_deploy.halting). A
puzzle's answer is its halting step's logits.

Two schedules (parameter ``schedule``):

- ``inflight`` (Triton's iterative sequences, 2.41 / 23.12 and later): every request is one puzzle
  ([1, S]) and one sequence of the sequence batcher (``oldest`` strategy, as many candidate
  sequences as the max batch). Each ``execute`` runs ONE ACT step over the rows of every live
  request Triton batched, answers the requests whose puzzle halted, and hands the others back
  to the scheduler (``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``), which forms the next batch from
  them and from newly arrived requests. Each request's carry lives here, keyed by its correlation
  id (the sequence batcher gives every request one), created at its first step (the ``START``
  control input), freed when the request is answered, cancelled, timed out, or not seen again
  (Triton drops a rescheduled request whose client cancelled it or whose timeout ran out without
  showing it to the model: such a carry is freed once it missed ``ORPHAN_EXECUTES`` executes and
  ``ORPHAN_S`` seconds). At most
  ``max_live`` carries are held; past it a request gets an error, never unbounded memory.
  The gauge ``hrm_act_live_puzzles`` (Triton's metrics port) counts the carries held.
- ``batch`` (any Triton with the Python backend): Triton's dynamic batcher forms a batch of
  requests and the loop runs it to its end; halted puzzles leave the batch, the batch waits for
  its slowest puzzle.

Every op of the step model is per row, so a puzzle's answer does not depend on the puzzles
stepped with it in either schedule.

Written by hrm-deploy (hrm_deploy/serve/triton_models/act_driver.py); self-contained on purpose.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

# A carry whose request has missed this many executes and this many seconds is freed: every live
# request is a candidate of every batch (candidates = max batch), so a missing one was dropped.
ORPHAN_EXECUTES, ORPHAN_S = 2, 1.0


def halting(rule):
    """``rule`` text -> function (q_halt, q_continue) -> bool mask of halted rows."""
    if rule == "off":
        return None
    if rule == "q":
        return lambda qh, qc: qh > qc
    if rule == "q0":  # the q rule of a model trained to halt on q_halt alone (TRM's no_ACT_continue)
        return lambda qh, qc: qh > 0
    if rule.startswith("threshold:"):
        x = float(rule.split(":", 1)[1])
        return lambda qh, qc: qh > np.log(x / (1.0 - x))  # sigmoid(qh) > x without overflow
    raise ValueError(f"unknown halt rule {rule!r}; use off, q or threshold:X")


class Carry:
    """One in-flight puzzle: its recurrent state [1, T, D] x 2, steps run, q_halt per step."""

    def __init__(self, carry_shape, steps, now, timeout_us):
        self.z_h = np.zeros(carry_shape, np.float32)
        self.z_l = np.zeros(carry_shape, np.float32)
        self.step = 0
        self.q_halt = np.full((1, steps), np.nan, np.float32)
        self.started, self.seen, self.tick = now, now, 0
        self.deadline = now + timeout_us / 1e6 if timeout_us else None


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.step_model = params["step_model"]
        # the step graph's I/O names, in call order (hrm_deploy.contract, written by the repository writer):
        # inputs: tokens, puzzle ids, carry H, carry L, reset; outputs: carry H, carry L, logits, q_halt, q_continue
        self.step_inputs = params["step_inputs"].split(",")
        self.step_outputs = params["step_outputs"].split(",")
        self.steps = int(params["steps"])
        self.carry = [int(params["carry_len"]), int(params["hidden_size"])]
        self.vocab = int(params["vocab_size"])
        self.puzzle_ids = int(params.get("num_puzzle_identifiers", "0")) or None
        self.halt = halting(params.get("halt", "off"))
        self.inflight = params.get("schedule", "batch") == "inflight"
        self.max_live = int(params.get("max_live", "0")) or config.get("max_batch_size", 1)
        self.live = {}  # correlation id -> Carry (in-flight schedule)
        self.tick = 0  # executes so far
        self.gauge = None
        if self.inflight:  # the family must outlive its metric: both kept
            self.family = pb_utils.MetricFamily(
                name="hrm_act_live_puzzles",
                description="puzzles whose ACT carry the in-flight driver holds",
                kind=pb_utils.MetricFamily.GAUGE,
            )
            self.gauge = self.family.Metric(labels={"model": args["model_name"], "version": args["model_version"]})

    def execute(self, requests):
        return self._execute_inflight(requests) if self.inflight else self._execute_batch(requests)

    # ------------------------------------------------------------------ shared
    def _step(self, tokens, ids, z_h, z_l, reset):
        """One ACT step of the step model over B rows; ``reset`` bool [B] (rows that start afresh)."""
        # [B, 1]: the step model's config gives 1-D graph inputs a dim with reshape { shape: [] }
        values = (tokens, ids.reshape(-1, 1), z_h, z_l, reset.reshape(-1, 1))
        request = pb_utils.InferenceRequest(
            model_name=self.step_model,
            requested_output_names=self.step_outputs,
            inputs=[pb_utils.Tensor(name, value) for name, value in zip(self.step_inputs, values)],
        )
        response = request.exec()
        if response.has_error():
            raise pb_utils.TritonModelException(f"step model {self.step_model}: {response.error().message()}")
        return [pb_utils.get_output_tensor_by_name(response, n).as_numpy() for n in self.step_outputs]

    def _problem(self, tokens, ids):
        """Why these puzzles cannot be answered (one line), or None."""
        if ((tokens < 0) | (tokens >= self.vocab)).any():
            return f"tokens outside the vocabulary 0..{self.vocab - 1}; encode puzzles as the model's data"
        if self.puzzle_ids is not None and ((ids < 0) | (ids >= self.puzzle_ids)).any():
            return f"puzzle identifier {int(ids.max())} is outside 0..{self.puzzle_ids - 1}"
        return None

    @staticmethod
    def _inputs(request):
        tokens = pb_utils.get_input_tensor_by_name(request, "inputs").as_numpy()
        ids = pb_utils.get_input_tensor_by_name(request, "puzzle_identifiers").as_numpy().reshape(-1)
        return tokens, ids.astype(np.int32)

    @staticmethod
    def _answer(logits, q_halt, steps):
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("answer", logits.argmax(-1).astype(np.int32)),
                pb_utils.Tensor("logits", logits),
                pb_utils.Tensor("q_halt_logits", q_halt),
                pb_utils.Tensor("steps", steps),
            ]
        )

    @staticmethod
    def _error(message, code=None):
        error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
        return pb_utils.InferenceResponse(output_tensors=[], error=error)

    # ------------------------------------------------------------------ in-flight: one step per execute
    def _execute_inflight(self, requests):
        now = time.monotonic()
        self.tick += 1
        responses = [None] * len(requests)
        rows = []  # (index in requests, correlation id, tokens [1, S], ids [1])
        for i, request in enumerate(requests):
            key = request.correlation_id()
            start = pb_utils.get_input_tensor_by_name(request, "START")
            fresh = key not in self.live or (start is not None and bool(start.as_numpy().reshape(-1)[0]))
            if request.is_cancelled():
                self.live.pop(key, None)
                responses[i] = self._error("the request was cancelled", pb_utils.TritonError.CANCELLED)
                continue
            tokens, ids = self._inputs(request)
            problem = self._problem(tokens, ids)
            if problem is None and fresh and key not in self.live and len(self.live) >= self.max_live:
                problem = f"the model holds {len(self.live)} puzzles in flight (its limit); retry later"
            if problem is not None:
                self.live.pop(key, None)
                responses[i] = self._error(problem)
                continue
            if fresh:
                self.live[key] = Carry([1] + self.carry, self.steps, now, request.timeout())
            carry = self.live[key]
            if carry.deadline is not None and now > carry.deadline:
                self.live.pop(key)
                responses[i] = self._error(f"the request timed out after {now - carry.started:.1f} s")
                continue
            carry.seen, carry.tick = now, self.tick
            rows.append((i, key, tokens, ids))
        if rows:
            self._step_rows(requests, responses, rows)
        stale = [k for k, c in self.live.items() if self.tick - c.tick > ORPHAN_EXECUTES and now - c.seen > ORPHAN_S]
        for key in stale:
            del self.live[key]  # its request was dropped by Triton (cancelled or timed out) while rescheduled
        self.gauge.set(len(self.live))
        return responses

    def _step_rows(self, requests, responses, rows):
        carries = [self.live[key] for _, key, _, _ in rows]
        tokens = np.concatenate([t for _, _, t, _ in rows])
        ids = np.concatenate([p for _, _, _, p in rows])
        reset = np.asarray([c.step == 0 for c in carries])
        try:
            z_h, z_l, logits, q_halt, q_continue = self._step(
                tokens, ids, np.concatenate([c.z_h for c in carries]), np.concatenate([c.z_l for c in carries]), reset
            )
        except Exception as exc:  # the step model failed: these requests fail, the model goes on
            for i, key, _, _ in rows:
                self.live.pop(key, None)
                responses[i] = self._error(f"ACT step failed: {exc}")
            return
        q_halt, q_continue = q_halt.reshape(-1), q_continue.reshape(-1)
        for j, (i, key, _, _) in enumerate(rows):
            carry = carries[j]
            carry.step += 1
            carry.q_halt[0, carry.step - 1] = q_halt[j]
            done = carry.step >= self.steps or (
                self.halt is not None and bool(self.halt(q_halt[j : j + 1], q_continue[j : j + 1])[0])
            )
            if done:
                del self.live[key]
                steps = np.full((1, 1), carry.step, np.int32)
                responses[i] = self._answer(logits[j : j + 1], carry.q_halt, steps)
            else:
                carry.z_h, carry.z_l = z_h[j : j + 1], z_l[j : j + 1]
                requests[i].set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)

    # ------------------------------------------------------------------ batch: each batch runs to its end
    def _solve(self, tokens, ids):
        b = len(tokens)
        z_h = np.zeros([b] + self.carry, np.float32)
        z_l = np.zeros_like(z_h)
        logits = np.zeros((b, tokens.shape[1], self.vocab), np.float32)
        q_halt = np.full((b, self.steps), np.nan, np.float32)
        steps = np.full((b, 1), self.steps, np.int32)
        active = np.arange(b)
        for i in range(self.steps):
            z_h, z_l, lg, qh, qc = self._step(tokens[active], ids[active], z_h, z_l, np.full(len(active), i == 0))
            logits[active] = lg
            q_halt[active, i] = qh.reshape(-1)
            if self.halt is None or i == self.steps - 1:
                continue
            done = self.halt(qh.reshape(-1), qc.reshape(-1))
            steps[active[done], 0] = i + 1
            keep = ~done
            if not keep.any():
                break
            active, z_h, z_l = active[keep], z_h[keep], z_l[keep]
        return logits, q_halt, steps

    def _execute_batch(self, requests):
        sizes, tokens, ids = [], [], []
        for request in requests:
            t, p = self._inputs(request)
            sizes.append(len(t))
            tokens.append(t)
            ids.append(p)
        tokens, ids = np.concatenate(tokens), np.concatenate(ids)
        problem = self._problem(tokens, ids)
        if problem is not None:  # one clear error for the batch rather than garbage answers
            return [self._error(problem) for _ in requests]
        logits, q_halt, steps = self._solve(tokens, ids)
        responses, start = [], 0
        for n in sizes:
            sl = slice(start, start + n)
            responses.append(self._answer(logits[sl], q_halt[sl], steps[sl]))
            start += n
        return responses
