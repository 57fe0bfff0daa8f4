"""The accuracy-budget fallback every Q/DQ path shares: keep the fewest most harmful layers in
float until the graph is within the accuracy rule. One search over the groups (all unrolled copies
of one weight, :func:`weight_groups`): :func:`bisect_fallback` (rank once by a cheap signal, then
bisect with whole-holdout measurements, bounded in probes and time), used by the precision stage
(:func:`sensitivity_fallback`, every probe written from the job) and the cpu target's static INT8
(whose probes are graph edits)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from hrm_deploy.errors import ConfigError
from hrm_deploy.precision.registry import get_precision, load
from hrm_deploy.precision.rule import Holdout, Quality, refusal
from hrm_deploy.progress import Stages

if TYPE_CHECKING:
    from hrm_deploy.precision.convert import PrecisionConfig
    from hrm_deploy.precision.job import QuantJob

Q = TypeVar("Q")  # one measurement of a probe graph (bisect_fallback)


def weight_groups(model: Any, quantized: set[str] | list[str]) -> dict[str, list[str]]:
    """The quantized MatMul/Gemm nodes of ``model`` grouped by the weight they read (input 1): the
    unit the fallbacks keep in float, every unrolled copy of one layer together."""
    from hrm_deploy.export.loop_body import quantizable_nodes

    names = set(quantized)
    groups: dict[str, list[str]] = {}
    for node in quantizable_nodes(model):
        if node.name in names:
            groups.setdefault(node.input[1], []).append(node.name)
    return groups


# The bisection's bounds: whole-holdout probes and seconds (a bisection over a Sudoku-size model's
# ~50 weights needs 6 probes; the bounds keep a model whose probes are slow from running on for hours)
MAX_PROBES = 12
MAX_SECONDS = 600.0


@dataclass
class Choice(Generic[Q]):
    """What :func:`bisect_fallback` chose: the weights kept FP32 (most sensitive first), every
    weight's ranking signal, the chosen mix's measurement, the whole-holdout probes run and the
    bounds they ran under (``stopped``: why the search ended before it narrowed the count down)."""

    kept_float: list[str]
    sensitivity: dict[str, float]
    measured: Q
    probes: int
    limits: dict[str, Any]


def bisect_fallback(
    groups: list[str],
    rank: Callable[[str], float],
    measure: Callable[[list[str]], Q],
    within: Callable[[Q], bool],
    refuse: Callable[[Q | None], str],
    max_probes: int = MAX_PROBES,
    max_seconds: float = MAX_SECONDS,
) -> Choice[Q]:
    """The fewest most-sensitive ``groups`` to keep FP32: ``rank(group)`` = its sensitivity
    (higher = more harmful INT8; a cheap signal, not a probe), ``measure(kept)`` = the graph with
    ``kept`` FP32, ``within`` the budget test. Bisects k in 1..len-1 (all FP32 is no INT8 graph)
    with at most ``max_probes`` measurements and ``max_seconds``; past either it keeps the smallest
    k measured within (saying it stopped) or, with none, refuses. Raises ConfigError
    (``refuse(last measurement)``) when no measured mix is within the budget."""
    import time

    start = time.monotonic()
    sensitivity = {g: rank(g) for g in groups}
    order = sorted(groups, key=lambda g: -sensitivity[g])
    probes = 0
    low, high = 1, len(groups) - 1  # the answer is in [low, high], if any
    best: tuple[int, Q] | None = None
    last: Q | None = None
    stopped = None
    while low <= high:
        if probes >= max_probes or time.monotonic() - start > max_seconds:
            stopped = f"bounds reached after {probes} probes in {time.monotonic() - start:.0f} s"
            break
        k = (low + high) // 2
        last = measure(order[:k])
        probes += 1
        if within(last):
            best, high = (k, last), k - 1
        else:
            low = k + 1
    limits: dict[str, Any] = {"max_probes": max_probes, "max_seconds": max_seconds, "stopped": stopped}
    if best is None:
        message = refuse(last)
        if stopped:
            message = f"{message} (the fallback search stopped: {stopped})"
        raise ConfigError(message)
    return Choice(order[: best[0]], sensitivity, best[1], probes, limits)


def sensitivity_fallback(
    job: QuantJob, out_tmp: Path, holdout: Holdout, config: PrecisionConfig, stages: Stages
) -> dict[str, Any]:
    """Keep the fewest most harmful layers (all unrolled copies of one weight) in float so that the
    Q/DQ graph at ``out_tmp`` is within the rule (:meth:`~hrm_deploy.precision.rule.Quality.within`:
    the points lost *and* the argmax agreement) on ``holdout``: the same search as the cpu target's
    (:func:`bisect_fallback`). Ranking: each weight's own output error in one pass
    (:func:`hrm_deploy.precision.sensitivity.local_errors`); where a format's activations are not
    Q/DQ pairs it can read (NVFP4's dynamic FP4), one probe per weight with only it quantized. Every
    probe is written by the row's writer from the same job (no recalibration, no parse). The caller
    measures the published graph again and judges it."""
    import onnx

    from hrm_deploy.precision import sensitivity

    budget = float(config.accuracy_budget or 0.0)
    current = holdout.measure(out_tmp)
    measured_key = f"{config.precision}_exact"
    quantize = load(get_precision(config.precision).writer or "")
    report: dict[str, Any] = {
        "fp32_exact": current.fp32_exact,
        measured_key: current.int8_exact,
        "budget_points": budget,
        "kept_float": [],
    }
    if current.within(budget):
        return report
    by_weight = weight_groups(job.model, job.plan.quantize)
    probe = out_tmp.with_name(out_tmp.name + ".probe.onnx")

    def measure(kept: list[str]) -> Quality:
        quantize(job, probe, tuple(n for w in kept for n in by_weight[w]))
        return holdout.measure(probe)

    def refuse(q: Quality | None) -> str:
        return refusal(config.precision.upper(), current, q or current, len(by_weight) - 1, budget)

    signal = sensitivity.local_errors(
        onnx.load(str(out_tmp)), job.model, by_weight, holdout.examples, job.source, job.meta
    )
    ranking = "each weight's own output error (one pass)"
    if not any(signal.values()):  # no Q/DQ activation to read: measure each weight alone quantized
        ranking = "points lost with only that weight quantized (one probe per weight)"

        def alone(weight: str) -> float:
            q = measure([w for w in by_weight if w != weight])
            return q.loss + (100.0 - q.agreement)

        signal = {w: alone(w) for w in by_weight}
    try:
        with stages.stage(f"keeping the most harmful of {len(by_weight)} layers float (ranked by {ranking})"):
            chosen = bisect_fallback(list(by_weight), signal.__getitem__, measure, lambda q: q.within(budget), refuse)
    finally:
        probe.unlink(missing_ok=True)
    final = quantize(job, out_tmp, tuple(n for w in chosen.kept_float for n in by_weight[w]))
    report.update(
        {measured_key: chosen.measured.int8_exact},
        kept_float=chosen.kept_float,
        layer_loss_points={w: round(v, 6) for w, v in chosen.sensitivity.items()},
        search={"ranking": ranking, "probes": chosen.probes, "limits": chosen.limits},
    )
    report["quantized_nodes"] = len(final.quantize)  # in the published graph (the layers kept float are out)
    return report
