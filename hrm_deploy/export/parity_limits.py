"""The limits of the export's parity check: what float32 may differ by between ONNX Runtime and PyTorch.

A step's tensors are compared with PyTorch float32 run from the same carry. Rounding differs between
the two (and between CPUs: AVX2 and AVX-512 kernels block and reduce differently), and accumulates with
each application of the recurrent layer stack. So a tensor's limit is

1. :func:`strict_limit`: ``ABS_FLOOR`` (1e-4) of its scale at :data:`REFERENCE_DEPTH` applications per step,
   growing linearly with :func:`step_depth` (H_cycles x (L_cycles + 1));
2. where that is missed, ``NOISE_FACTOR`` x what PyTorch float32 varies *on this machine* from the same
   carry with another batch order and thread count (:class:`Float32Noise`), measured only then;
3. and a carry within :data:`ARGMAX_BAND` limits passes where every answer (logits argmax) agrees with
   PyTorch's; the report says which rule decided.

An export bug moves values by orders of magnitude more than any of these.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hrm_deploy.contract import CARRY
from hrm_deploy.model.config import HRMConfig

NOISE_FACTOR = 10.0  # ORT may deviate this many times float32's own variation...
ABS_FLOOR = 1e-4  # ...or this much, relative to the output scale, at the reference depth
REFERENCE_DEPTH = 6  # ABS_FLOOR holds at HRM's 2 x (2 + 1) applications per step; deeper steps scale it
ARGMAX_BAND = 4.0  # a carry within this many limits passes where every answer (logits argmax) agrees


@dataclass
class TensorDiff:
    """How far a candidate tensor is from its reference: max abs and relative difference (float64),
    and for logits the fraction of positions whose argmax agrees."""

    max_abs: float
    max_rel: float
    argmax_agreement: float | None = None

    @classmethod
    def of(cls, candidate: np.ndarray, reference: np.ndarray, argmax: bool = False) -> TensorDiff:
        c, r = candidate.astype(np.float64), reference.astype(np.float64)
        diff = np.abs(c - r)
        rel = diff / np.maximum(np.abs(r), 1e-6)
        agree = float((c.argmax(-1) == r.argmax(-1)).mean()) if argmax else None
        return cls(float(diff.max(initial=0.0)), float(rel.max(initial=0.0)), agree)


def step_depth(config: HRMConfig) -> int:
    """Recurrent layer-stack applications in one ACT step: H_cycles x (L_cycles + 1) (each H cycle
    runs the L level L_cycles times, then the H level, or TRM's L net once more for z_H)."""
    return int(config.H_cycles) * (int(config.L_cycles) + 1)


def strict_limit(config: HRMConfig, scale: float) -> float:
    """The first limit of a step's tensor of max magnitude ``scale``: ``ABS_FLOOR`` of the scale at
    :data:`REFERENCE_DEPTH` applications, growing with the depth (rounding accumulates per application)."""
    return ABS_FLOOR * max(1.0, scale) * max(1.0, step_depth(config) / REFERENCE_DEPTH)


class Float32Noise:
    """How much PyTorch float32 itself varies on this machine for one checked step: the same segment from
    the same carry, rows in reverse order on one thread (another GEMM blocking and reduction order),
    against the reference run. Measured only for a tensor past its strict limit (it costs a segment)."""

    def __init__(self, segment: Callable[[Any, list], list[tuple]], starts: tuple, ref: dict[int, tuple]):
        # segment(x, [carry]) -> [(z_H, z_L, logits, q_halt, q_continue)] float64: parity's PyTorch run
        self.segment, (self.x, self.carries), self.ref = segment, starts, ref
        self._cache: dict[int, tuple] = {}

    def of(self, step: int, index: int) -> float:
        """Max abs of PyTorch vs PyTorch on output ``index`` (z_H, z_L, logits, q_halt, q_continue)."""
        import torch

        if step not in self._cache:
            z_H, z_L = (torch.as_tensor(np.asarray(c)[::-1].copy()) for c in self.carries[step])
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                (other,) = self.segment(self.x.flip(0), [(z_H, z_L)])
            finally:
                torch.set_num_threads(threads)
            self._cache[step] = tuple(t[::-1] for t in other)
        return float(np.abs(self._cache[step][index] - self.ref[step][index]).max(initial=0.0))


_REF_INDEX = {CARRY[0]: 0, CARRY[1]: 1, "logits": 2, "q_halt_logits": 3, "q_continue_logits": 4}


def judge(name: str, triples: list, config: HRMConfig, noise: Float32Noise) -> dict:
    """The verdict on one tensor over its checked steps: the worst step against its limit, which is
    the depth-scaled strict limit or, where that is missed, ``NOISE_FACTOR`` x float32's own variation."""
    worst, worst_step, worst_limit, agree = 0.0, triples[0][0] if triples else 0, 0.0, None
    for i, c, r in triples:
        diff = TensorDiff.of(c, r, argmax=name == "logits")
        limit = strict_limit(config, float(np.abs(r).max(initial=0.0)))
        if diff.max_abs / limit >= (worst / worst_limit if worst_limit else 0.0):
            worst, worst_step, worst_limit = diff.max_abs, i, limit
        agree = diff.argmax_agreement if name == "logits" else agree
    verdict = {
        "max_abs": worst,
        "strict_limit": worst_limit,
        "limit": worst_limit,
        "limit_from": f"{ABS_FLOOR:g} of the scale at depth {step_depth(config)}",
        "worst_step": worst_step,
        "passed": worst <= worst_limit,
        "argmax_agreement": agree,
        "check": "teacher-forced per step",
    }
    if not verdict["passed"]:
        measured = noise.of(worst_step, _REF_INDEX[name])
        verdict["torch_float32_noise"] = measured
        if NOISE_FACTOR * measured > worst_limit:
            verdict.update(
                limit=NOISE_FACTOR * measured,
                limit_from=f"{NOISE_FACTOR:g} x PyTorch float32 against itself on this machine",
                passed=worst <= NOISE_FACTOR * measured,
            )
    return verdict


def by_argmax(entry: dict[str, dict]) -> None:
    """A carry or Q logit past its limit, within :data:`ARGMAX_BAND` of it, passes where the logits'
    argmax agrees with PyTorch on every cell (``decided_by`` says so); ``entry``: tensor -> verdict."""
    if entry["logits"]["argmax_agreement"] != 1.0:
        return
    for name, verdict in entry.items():
        if name != "logits" and not verdict["passed"] and verdict["max_abs"] <= ARGMAX_BAND * verdict["limit"]:
            verdict.update(passed=True, decided_by="argmax agreement 100 %")
