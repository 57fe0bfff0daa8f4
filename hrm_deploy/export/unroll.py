"""ACT unrolling: fixed-step modules with no data-dependent control flow.

Upstream evaluation always runs exactly ``halt_max_steps`` ACT segments (rows only
halt early in training), so a fixed unroll from the initial state reproduces it.

* :class:`FixedStepHRM` runs all segments: (inputs, puzzle_identifiers) -> final logits,
  per-step q_halt / q_continue logits, optionally per-step predictions.
* :class:`SingleStepHRM` runs one segment with the carry in and out, for a stepwise
  runtime (host loop of ``halt_max_steps`` iterations, carry kept on the device).
* :class:`EmbedInit` and :class:`StepCore` are the two pieces the ONNX exporter traces
  once and then replicates at graph level (see ``onnx_export``).
"""

from __future__ import annotations

import torch
from torch import nn

from hrm_deploy.model.hrm import HRMACT, Carry, HRMCore


def _core(model: HRMACT | HRMCore) -> HRMCore:
    return model.inner if isinstance(model, HRMACT) else model


class EmbedInit(nn.Module):
    """(inputs, puzzle_identifiers) -> (input embeddings [B,T,D], z_H0, z_L0)."""

    def __init__(self, core: HRMCore):
        super().__init__()
        self.core = core

    def embed(self, inputs: torch.Tensor, puzzle: torch.Tensor) -> torch.Tensor:
        return self.core.input_embeddings(inputs, puzzle)

    def forward(self, inputs: torch.Tensor, puzzle: torch.Tensor):
        x = self.embed(inputs, puzzle)
        init = self.core.initial_state(1, x.device)
        return x, init.z_H.expand(x.shape), init.z_L.expand(x.shape)


class EmbedInitRows(EmbedInit):
    """(inputs, puzzle_emb_rows) -> as :class:`EmbedInit`: the puzzle table's rows come in
    gathered (``export --puzzle-emb external``), so the table is not part of the graph."""

    def embed(self, inputs: torch.Tensor, puzzle: torch.Tensor) -> torch.Tensor:
        return self.core.embed_with_rows(inputs, puzzle)


class StepCore(nn.Module):
    """(z_H, z_L, x) -> (z_H', z_L', logits, q_halt, q_continue): one segment, embeddings given."""

    def __init__(self, core: HRMCore):
        super().__init__()
        self.core = core

    def forward(self, z_H: torch.Tensor, z_L: torch.Tensor, x: torch.Tensor):
        carry = self.core.recur(Carry(z_H, z_L), x)
        logits, q_halt, q_continue = self.core.heads(carry.z_H)
        return carry.z_H, carry.z_L, logits, q_halt, q_continue


class FixedStepHRM(nn.Module):
    """All ACT segments unrolled: returns final logits [B,S,V], q_halt and q_continue
    logits [B,steps] and, with ``step_predictions``, per-step argmax [B,steps,S] (int32)."""

    def __init__(self, model: HRMACT | HRMCore, steps: int | None = None, step_predictions: bool = False):
        super().__init__()
        core = _core(model)
        self.embed_init = EmbedInit(core)
        self.step = StepCore(core)
        self.steps = int(steps if steps is not None else core.config.halt_max_steps)
        if self.steps < 1:
            raise ValueError("steps must be >= 1")
        self.step_predictions = step_predictions

    @property
    def config(self):
        return self.step.core.config

    def forward(self, inputs: torch.Tensor, puzzle_identifiers: torch.Tensor):
        x, z_H, z_L = self.embed_init(inputs, puzzle_identifiers)
        q_halts, q_continues, predictions = [], [], []
        logits = x.new_empty(0)
        for _ in range(self.steps):
            z_H, z_L, logits, q_halt, q_continue = self.step(z_H, z_L, x)
            q_halts.append(q_halt)
            q_continues.append(q_continue)
            if self.step_predictions:
                predictions.append(logits.argmax(-1).to(torch.int32))
        outputs: tuple[torch.Tensor, ...] = (logits, torch.stack(q_halts, 1), torch.stack(q_continues, 1))
        if self.step_predictions:
            outputs += (torch.stack(predictions, 1),)
        return outputs


class SingleStepHRM(nn.Module):
    """One ACT segment, carry in and out. Rows with ``reset`` True start from H_init/L_init
    (upstream's ``reset_carry``): the first call of a host loop passes reset=True."""

    def __init__(self, model: HRMACT | HRMCore):
        super().__init__()
        core = _core(model)
        self.embed_init = EmbedInit(core)
        self.step = StepCore(core)

    def forward(self, inputs, puzzle_identifiers, z_H, z_L, reset):
        x, z_H0, z_L0 = self.embed_init(inputs, puzzle_identifiers)
        mask = reset.view(-1, 1, 1)
        return self.step(torch.where(mask, z_H0, z_H), torch.where(mask, z_L0, z_L), x)


class LoopHRM(nn.Module):
    """The ACT loop as one ``torch.while_loop`` (the ``.pt2`` twin of ``export --mode loop``): runs
    segments until every row halted by ``halt`` (a :class:`hrm_deploy.export.loop.LoopHalt`) or the
    last step; halted rows frozen by masks. (inputs [B,S], puzzle_identifiers [B]) -> (logits
    [B,S,V] of each row's halting step, q_halt_logits [B,N], q_continue_logits [B,N] (NaN after a
    row's halting step), steps_used int32 [B]): the loop graph's outputs, the host loop's values.
    AOTInductor lowers the loop into the package (a device loop on CUDA, no host sync per step)."""

    def __init__(self, model: HRMACT | HRMCore, halt, steps: int | None = None):
        super().__init__()
        core = _core(model)
        self.embed_init = EmbedInit(core)
        self.step = StepCore(core)
        self.steps = int(steps if steps is not None else core.config.halt_max_steps)
        self.halt = halt
        self.bound: float | None = halt.bound  # what q_halt must exceed (None: q_continue)

    def forward(self, inputs: torch.Tensor, puzzle_identifiers: torch.Tensor):
        from torch._higher_order_ops.while_loop import while_loop

        x, z_H, z_L = self.embed_init(inputs, puzzle_identifiers)
        cfg, batch, steps = self.step.core.config, inputs.shape[0], self.steps
        nan = torch.full((batch, steps), float("nan"), device=x.device, dtype=x.dtype)
        state = (
            torch.zeros((), dtype=torch.int64, device=x.device),  # steps run so far
            z_H.contiguous(),
            z_L.contiguous(),
            torch.zeros(batch, dtype=torch.bool, device=x.device),  # halted
            torch.zeros(batch, dtype=torch.int32, device=x.device),  # steps_used
            x.new_zeros(batch, cfg.seq_len, cfg.vocab_size),  # logits of each row's halting step
            nan,
            nan.clone(),
        )

        def running(i, z_H, z_L, halted, used, logits, q_halts, q_continues):
            return (~halted).any()

        def segment(i, z_H, z_L, halted, used, logits, q_halts, q_continues):
            z_H, z_L, new_logits, q_halt, q_continue = self.step(z_H, z_L, x)
            live, step = ~halted, i + 1
            logits = torch.where(live.view(-1, 1, 1), new_logits, logits)
            used = torch.where(live, step.to(torch.int32), used)
            column = (torch.arange(steps, device=x.device) == i).view(1, -1) & live.view(-1, 1)  # [B, N]
            q_halts = torch.where(column, q_halt.view(-1, 1), q_halts)
            q_continues = torch.where(column, q_continue.view(-1, 1), q_continues)
            stop = step >= steps
            if self.halt.mode != "off":
                rule = q_halt > (q_continue if self.bound is None else self.bound)
                stop = stop | (rule & (step >= self.halt.min_steps))
            return step, z_H.clone(), z_L.clone(), halted | stop, used, logits, q_halts, q_continues

        out = while_loop(running, segment, state)
        return out[5], out[6], out[7], out[4]


def unroll(model: HRMACT | HRMCore, steps: int | None = None, step_predictions: bool = False) -> FixedStepHRM:
    """Unroll ``model`` to exactly ``steps`` (default ``halt_max_steps``) ACT segments."""
    return FixedStepHRM(model, steps, step_predictions).eval()


def single_step(model: HRMACT | HRMCore) -> SingleStepHRM:
    """The one-segment module (carry in, carry out) for a stepwise runtime."""
    return SingleStepHRM(model).eval()


@torch.inference_mode()
def upstream_evaluate(model: HRMACT, inputs: torch.Tensor, puzzle_identifiers: torch.Tensor) -> dict[str, torch.Tensor]:
    """Upstream's evaluation loop: ``initial_carry``, call until every row halted, keep the
    last outputs. The semantics reference for :func:`unroll` (one host sync per step)."""
    batch = {"inputs": inputs, "puzzle_identifiers": puzzle_identifiers}
    carry = model.initial_carry(batch)
    q_halts, q_continues = [], []
    while True:
        carry, outputs = model(carry, batch)
        q_halts.append(outputs["q_halt_logits"])
        q_continues.append(outputs["q_continue_logits"])
        if bool(carry.halted.all()):
            break
    return {
        "logits": outputs["logits"],
        "q_halt_logits": torch.stack(q_halts, 1),
        "q_continue_logits": torch.stack(q_continues, 1),
        "steps": carry.steps,
    }
