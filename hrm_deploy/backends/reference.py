"""The reference: our PyTorch HRM (SDPA attention) unrolled to a fixed number of ACT steps, and
its one ACT segment behind the step contract (:class:`TorchStep`, what early halting drives).

float32 by default; ``dtype="bfloat16"`` and ``compile=True`` (``torch.compile`` with CUDA
graphs, mode "reduce-overhead", on a GPU) give the fastest PyTorch-only deployment, the
comparator a user would otherwise pick."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.contract import HaltFn
from hrm_deploy.errors import ConfigError, require
from hrm_deploy.runtime.base import Runner


class TorchRunner(Runner):
    name = "reference"
    supports_halt = True

    def __init__(
        self,
        checkpoint: str | Path,
        steps: int | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        compile: bool = False,
        **checkpoint_overrides: Any,
    ):
        if dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"reference dtype {dtype!r}: use float32 or bfloat16")
        self.checkpoint, self.device_name, self.dtype, self.compile = Path(checkpoint), device, dtype, compile
        self.overrides = checkpoint_overrides
        self.requested_steps = steps
        self.precision = "fp32" if dtype == "float32" else "bf16"
        self.steps = steps or 0
        self._module: Any = None

    def _activate(self) -> None:
        torch = require("torch", "torch", "The PyTorch reference runner")
        from hrm_deploy.export.unroll import unroll
        from hrm_deploy.model.checkpoint import load_checkpoint

        model, config = load_checkpoint(self.checkpoint, **self.overrides)
        if self.dtype == "bfloat16":
            model = type(model)(config.replace(forward_dtype="bfloat16")).eval()
            model.load_state_dict(load_checkpoint(self.checkpoint, **self.overrides)[0].state_dict())
        self.steps = self.requested_steps or config.halt_max_steps
        self.device = torch.device(self.device_name)
        module = unroll(model, self.steps, step_predictions=True).to(self.device)
        if self.compile:
            module = torch.compile(module, mode="reduce-overhead" if self.device.type == "cuda" else "default")
        self._module, self._torch, self._model = module, torch, model

    def _infer(self, feeds: dict[str, np.ndarray], halt: HaltFn | None) -> dict[str, np.ndarray]:
        """Outputs for one batch; with ``halt`` (e.g. ``HaltRule.should_halt``) rows stop early
        through the one-segment module (hrm_deploy.halting); ``steps_used`` int32 [B]."""
        if halt is not None:
            from hrm_deploy.halting import drive

            return drive(
                self.step_function(), np.asarray(feeds["inputs"]), np.asarray(feeds["puzzle_identifiers"]), halt
            )
        torch = self._torch
        with torch.inference_mode():
            inputs = torch.from_numpy(np.ascontiguousarray(feeds["inputs"])).to(self.device)
            pids = torch.from_numpy(np.ascontiguousarray(feeds["puzzle_identifiers"])).to(self.device)
            logits, q_halt, q_continue, predictions = self._module(inputs, pids)
            return {
                "logits": logits.float().cpu().numpy(),
                "q_halt_logits": q_halt.float().cpu().numpy(),
                "q_continue_logits": q_continue.float().cpu().numpy(),
                "step_predictions": predictions.cpu().numpy(),
                "steps_used": np.full(len(feeds["inputs"]), self.steps, np.int32),
            }

    def step_function(self):
        """One ACT segment as a :class:`hrm_deploy.contract.StepFunction` (eager, no compile)."""
        if getattr(self, "_step_fn", None) is None:
            self._step_fn = TorchStep(self._model, self.device, self.steps)
        return self._step_fn

    def _close(self) -> None:
        self._module = self._step_fn = None


class TorchStep:
    """The PyTorch reference's one segment (``export.unroll.single_step``); the carry stays
    on the module's device as torch tensors, outputs come back as numpy."""

    def __init__(self, model: Any, device: Any = "cpu", steps: int | None = None):
        import torch

        from hrm_deploy.export.unroll import single_step

        self.torch, self.device = torch, torch.device(device)
        self.module = single_step(model).to(self.device)
        core = self.module.step.core
        self.steps = int(steps or core.config.halt_max_steps)
        self._state = (core.config.total_seq_len, core.config.hidden_size)
        self._dtype = next(self.module.parameters()).dtype

    def initial_carry(self, batch: int) -> Any:
        z = self.torch.zeros((batch, *self._state), dtype=self._dtype, device=self.device)
        return (z, z.clone())

    def take(self, carry: Any, rows: np.ndarray) -> Any:
        index = self.torch.from_numpy(np.asarray(rows, dtype=np.int64)).to(self.device)
        return tuple(c.index_select(0, index) for c in carry)

    def __call__(self, inputs, puzzle_ids, carry, reset):
        torch = self.torch
        with torch.inference_mode():

            def to(a: np.ndarray):
                return torch.from_numpy(np.ascontiguousarray(a)).to(self.device)

            z_H, z_L, logits, q_halt, q_continue = self.module(
                to(inputs.astype(np.int32)), to(puzzle_ids.astype(np.int32)), carry[0], carry[1], to(reset.astype(bool))
            )
            return (
                (z_H, z_L),
                logits.float().cpu().numpy(),
                q_halt.float().cpu().numpy(),
                q_continue.float().cpu().numpy(),
            )
