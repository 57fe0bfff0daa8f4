"""ACT driver (Triton Python backend): one request = one puzzle in, one answer out.

Runs the host loop over a single-step model (ONNX or TensorRT plan) with BLS calls: the carry
``z_H``/``z_L`` [B, S + prefix, hidden] starts at zero with ``reset=True`` on the first step;
up to ``steps`` ACT steps. Halting rule (parameter ``halt``): ``off`` runs every step (upstream's
evaluation), ``q`` stops a puzzle when ``q_halt > q_continue`` (upstream HRM's rule; ``q0``: ``q_halt > 0``, the
rule of models trained without the continue logit, written for ``--halt q`` of such a model), ``threshold:X``
when ``sigmoid(q_halt) > X`` (the rules of hrm_deploy.halting). Halted puzzles leave the batch; their last logits are the answer.

Written by hrm-deploy (hrm_deploy/serve/triton_models/act_driver.py); self-contained on purpose.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


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
        self.halt = halting(params.get("halt", "off"))

    def _step(self, tokens, ids, z_h, z_l, first):
        # [B, 1]: the step model's config gives 1-D graph inputs a dim with reshape { shape: [] }
        reset = np.full((len(tokens), 1), first, dtype=bool)
        values = (tokens, ids.reshape(-1, 1), z_h, z_l, reset)
        request = pb_utils.InferenceRequest(
            model_name=self.step_model,
            requested_output_names=self.step_outputs,
            inputs=[pb_utils.Tensor(name, value) for name, value in zip(self.step_inputs, values)],
        )
        response = request.exec()
        if response.has_error():
            raise pb_utils.TritonModelException(f"step model {self.step_model}: {response.error().message()}")
        return [pb_utils.get_output_tensor_by_name(response, n).as_numpy() for n in self.step_outputs]

    def _solve(self, tokens, ids):
        b = len(tokens)
        z_h = np.zeros([b] + self.carry, np.float32)
        z_l = np.zeros_like(z_h)
        logits = np.zeros((b, tokens.shape[1], self.vocab), np.float32)
        q_halt = np.full((b, self.steps), np.nan, np.float32)
        steps = np.full((b, 1), self.steps, np.int32)
        active = np.arange(b)
        for i in range(self.steps):
            z_h, z_l, lg, qh, qc = self._step(tokens[active], ids[active], z_h, z_l, i == 0)
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

    def execute(self, requests):
        sizes, tokens, ids = [], [], []
        for request in requests:
            t = pb_utils.get_input_tensor_by_name(request, "inputs").as_numpy()
            p = pb_utils.get_input_tensor_by_name(request, "puzzle_identifiers").as_numpy().reshape(-1)
            sizes.append(len(t))
            tokens.append(t)
            ids.append(p)
        tokens, ids = np.concatenate(tokens), np.concatenate(ids).astype(np.int32)
        bad = (tokens < 0) | (tokens >= self.vocab)
        if bad.any():  # one clear error for the batch rather than garbage answers
            err = pb_utils.TritonError(
                f"tokens outside the vocabulary 0..{self.vocab - 1}; encode puzzles as the model's data"
            )
            return [pb_utils.InferenceResponse(output_tensors=[], error=err) for _ in requests]
        logits, q_halt, steps = self._solve(tokens, ids)
        answer = logits.argmax(-1).astype(np.int32)
        responses, start = [], 0
        for n in sizes:
            sl = slice(start, start + n)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("answer", answer[sl]),
                        pb_utils.Tensor("logits", logits[sl]),
                        pb_utils.Tensor("q_halt_logits", q_halt[sl]),
                        pb_utils.Tensor("steps", steps[sl]),
                    ]
                )
            )
            start += n
        return responses
