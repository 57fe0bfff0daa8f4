"""The ONNX Runtime step function: the exported single-step graph behind the step contract
(:class:`hrm_deploy.contract.StepFunction`), which the ``ort`` runner and the halting scheduler
drive. Its one session call is :func:`hrm_deploy.onnx_runtime.step_once`, the same one export
parity and calibration use."""

from __future__ import annotations

from typing import Any

import numpy as np

from hrm_deploy.contract import FEEDS
from hrm_deploy.onnx_runtime import step_once, zero_carry


class OrtStep:
    """The exported single-step graph on an ONNX Runtime session; carry = (z_H, z_L) float32."""

    def __init__(self, session: Any, steps: int):
        self.session, self.steps = session, steps

    def initial_carry(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        return zero_carry(self.session, batch)

    def take(self, carry: Any, rows: np.ndarray) -> Any:
        return tuple(c[rows] for c in carry)

    def __call__(self, inputs, puzzle_ids, carry, reset):
        feeds = dict(zip(FEEDS, (inputs.astype(np.int32), puzzle_ids.astype(np.int32))))
        carry, (logits, q_halt, q_continue), _ = step_once(self.session, feeds, carry, reset.astype(bool))
        return carry, logits, q_halt, q_continue
