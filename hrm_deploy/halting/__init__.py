"""Early halting at inference: per-row ACT halting rules, a host-side step driver and
continuous batching, over any backend that runs one ACT segment per call.

Upstream evaluation always runs ``halt_max_steps`` segments; halting is therefore never on
by default (``HaltMode.OFF``). A rule decides after each segment which rows stop:

* ``q``: the checkpoint's own training rule: ``q_halt > q_continue`` (HRM), or ``q_halt > 0``
  where training ignored the continue logit (TRM's ``no_ACT_continue``); :func:`resolve_rule`
  reads which from the artifact's model config;
* ``threshold:X``: ``sigmoid(q_halt) > X``;
* ``budget:P``: a threshold calibrated on held-out data so that at most P points of exact
  accuracy are lost (:func:`calibrate_threshold` on per-step outputs; running the artifact for
  them is :func:`hrm_deploy.halting_report.calibrate_budget`, beside verify), stored in the
  artifact's manifest.

``min_steps`` / ``max_steps`` bound every rule; the last step always halts. A halted row keeps
the outputs of its halting step, which are exactly what running it alone to that step gives:
rows never interact inside a segment, and a new row starts from the initial state through the
step graph's per-row ``reset`` input.

Shapes: B rows, S = seq_len, V = vocab, T = steps. Carries are opaque to the driver (a tuple
of batch-first arrays or tensors); a :class:`~hrm_deploy.contract.StepFunction` (each backend
brings its own) knows how to make and slice them. This room imports no backend.

The room: :mod:`~hrm_deploy.halting.rules` (the rules), :mod:`~hrm_deploy.halting.scheduler` (the
host driver and continuous batching), :mod:`~hrm_deploy.halting.budget` (thresholds from per-step
outputs), :mod:`~hrm_deploy.halting.store` (where calibrations are kept). The verify and bench
reports and running an artifact for a budget live in :mod:`hrm_deploy.halting_report`.
"""

from hrm_deploy.contract import HaltFn, StepFunction
from hrm_deploy.halting.budget import accuracy_vs_steps, calibrate_threshold, exact_at, rule_summary
from hrm_deploy.halting.rules import HaltMode, HaltRule, halts_on_q_halt_alone, resolve_rule, simulate_steps
from hrm_deploy.halting.scheduler import drive, run_continuous
from hrm_deploy.halting.store import calibration_cache, stored_budget_threshold

__all__ = [
    "HaltFn",
    "HaltMode",
    "HaltRule",
    "StepFunction",
    "accuracy_vs_steps",
    "calibrate_threshold",
    "calibration_cache",
    "drive",
    "exact_at",
    "halts_on_q_halt_alone",
    "resolve_rule",
    "rule_summary",
    "run_continuous",
    "simulate_steps",
    "stored_budget_threshold",
]
