"""The cell-level judgement of a candidate against its reference (``hrm_deploy.agreement``), on the
trained fixture's real reference outputs: every wrong candidate below fails, at the thresholds of
the precision named, with labels or without; rounding-sized differences and flips where the
reference hesitated pass."""

from __future__ import annotations

import numpy as np
import pytest

from hrm_deploy.agreement import CELL_BAND, Agreement, NonFiniteReference, flip_margin, judge_cells, measure
from hrm_deploy.precision.registry import PRECISIONS

INT8, FP32 = PRECISIONS["int8"].thresholds, PRECISIONS["fp32"].thresholds


@pytest.fixture(scope="module")
def reference(trained_tiny):
    """The trained fixture's reference outputs on 64 held-out puzzles (64 x 81 = 5,184 cells)."""
    from hrm_deploy.backends import reference_runner
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.runtime.infer import infer_all

    runner = reference_runner(trained_tiny.checkpoint)
    runner.activate()
    try:
        out = infer_all(runner, load_examples(trained_tiny.data, 64, split="test"), 64)
    finally:
        runner.close()
    return {k: out[k] for k in ("logits", "q_halt_logits", "q_continue_logits", "steps_used")}


def _copy(outputs):
    return {k: np.array(v, copy=True) for k, v in outputs.items()}


def _margins(logits):
    top = np.sort(logits, -1)
    return (top[..., -1] - top[..., -2]) / np.abs(logits).max()


def test_rounding_sized_differences_pass_every_precision(reference):
    rng = np.random.default_rng(0)
    candidate = _copy(reference)
    scale = np.abs(reference["logits"]).max()
    candidate["logits"] += rng.normal(0, 1e-4 * scale, candidate["logits"].shape).astype(np.float32)
    for row in PRECISIONS.values():
        verdict = judge_cells(reference, candidate, row.thresholds)
        assert verdict.passed, (row.name, verdict.failures)


def test_one_garbage_position_fails_int8_without_labels(reference):
    """A whole position answered confidently wrong (+100 on a wrong class, -100 elsewhere) agrees on 80
    of 81 cells: 98.8 % >= INT8's 98 %, and it once passed. Its flips are where the reference was sure."""
    candidate = _copy(reference)
    answer = reference["logits"][:, 7].argmax(-1)
    garbage = np.full_like(candidate["logits"][:, 7], -100.0)
    garbage[np.arange(len(garbage)), (answer + 1) % garbage.shape[-1]] = 100.0
    candidate["logits"][:, 7] = garbage
    verdict = judge_cells(reference, candidate, INT8)
    assert verdict.agreement.logits.argmax_agreement >= INT8.min_argmax_agreement  # the old judge's only check
    assert any(
        line.startswith("answers flipped where the reference was sure") and "position 7" in line
        for line in verdict.failures
    )


def test_a_tenth_of_a_percent_of_garbage_cells_fails_fp32(reference):
    candidate = _copy(reference)
    cells = [(0, 3), (9, 40), (17, 80), (33, 12), (60, 61)]  # 5 of 5,184 cells
    for puzzle, position in cells:
        row = candidate["logits"][puzzle, position]
        row[:] = -row  # the reference's answer becomes its least likely
    verdict = judge_cells(reference, candidate, FP32)
    assert verdict.agreement.logits.argmax_agreement > 0.999  # within FP32's agreement threshold
    assert any("flipped where the reference was sure" in line for line in verdict.failures)
    assert any("the bound on every cell" in line for line in verdict.failures)


def test_confident_flips_fail_int8_where_near_ties_pass(reference):
    """Top-1 and top-2 swapped on 1 % of the cells: where the reference was sure, it fails INT8 (each
    swapped cell is only its margin away, inside INT8's closeness); where it hesitated, it passes."""
    margins = _margins(reference["logits"])
    order = np.argsort(margins, axis=None)
    count = margins.size // 100

    def swapped(cells):
        candidate = _copy(reference)
        for flat in cells:
            row = candidate["logits"][np.unravel_index(flat, margins.shape)]
            top = np.argsort(row)[-2:]
            row[top] = row[top[::-1]]
        return candidate

    sure = judge_cells(reference, swapped(order[-count:]), INT8)
    assert any("flipped where the reference was sure" in line for line in sure.failures), sure.failures
    assert sure.agreement.logits.flips == count and len(sure.agreement.logits.worst_flips) == 5
    hesitant = order[:count][margins.flat[order[:count]] <= flip_margin(INT8)]
    assert len(hesitant), "the fixture has cells where the reference hesitates"
    assert judge_cells(reference, swapped(hesitant), INT8).passed


def test_a_huge_logit_on_a_few_puzzles_fails_every_precision(reference):
    candidate = _copy(reference)
    candidate["logits"][:1, 5, 0] += 1000.0  # one puzzle of 64: 1.5 %
    for row in PRECISIONS.values():
        failures = judge_cells(reference, candidate, row.thresholds).failures
        assert any("the bound on every cell" in line for line in failures), row.name


def test_nan_at_one_position_fails_and_is_named(reference):
    candidate = _copy(reference)
    candidate["logits"][:, 30, :] = np.nan
    verdict = judge_cells(reference, candidate, INT8)
    assert verdict.failures[0] == (
        "the candidate's logits hold 704 non-finite values (NaN or inf), the first at puzzle 0, position 30"
    )
    assert np.isfinite(verdict.agreement.logits.max_rel)  # the measures stay numbers (JSON has no NaN)


def test_nan_q_halt_on_two_rows_fails(reference):
    candidate = _copy(reference)
    candidate["q_halt_logits"][[4, 11]] = np.nan
    failures = judge_cells(reference, candidate, INT8).failures
    assert failures == (
        "the candidate's q_halt_logits hold 2 non-finite values (NaN or inf), the first at puzzle 4, step 1",
    )


def test_q_halt_sign_flips_fail_where_the_reference_was_clear(reference):
    candidate = _copy(reference)
    candidate["q_halt_logits"][:3] *= -1  # 3 of 64 rows (4.7 %), within INT8's 95 % sign agreement
    verdict = judge_cells(reference, candidate, INT8)
    assert verdict.agreement.q_halt is not None and verdict.agreement.q_halt.sign_agreement >= 0.95
    assert any(line.startswith("q_halt signs flipped where the reference was sure") for line in verdict.failures)


def test_non_finite_steps_after_a_rows_halting_step_are_not_judged(reference):
    """A halted row's per-step outputs after its halting step are NaN by the runners' contract."""
    ref, candidate = _copy(reference), _copy(reference)
    for outputs in (ref, candidate):
        for name in ("q_halt_logits", "q_continue_logits"):
            outputs[name] = np.concatenate([outputs[name], np.full_like(outputs[name], np.nan)], 1)
        outputs["steps_used"] = np.ones(len(outputs["logits"]), np.int32)
    assert judge_cells(ref, candidate, FP32).passed


def test_the_references_own_nan_is_the_references_fault(reference):
    ref = _copy(reference)
    ref["logits"][2, 3, 4] = np.inf
    with pytest.raises(NonFiniteReference, match="the PyTorch reference's logits hold 1 non-finite value.*at fault"):
        measure(ref, reference, "the PyTorch reference")


def test_the_measures_read_back_from_a_report(reference):
    candidate = _copy(reference)
    candidate["logits"][:, 7] *= -1
    measured = measure(reference, candidate)
    again = Agreement.from_dict(measured.as_dict())
    assert again == measured and again.failures(INT8) == measured.failures(INT8)
    assert CELL_BAND * INT8.max_logits_rel_error > 1.0  # the band is a multiple of the closeness threshold


def test_logits_alone_are_judged_as_a_builds_rule_would_give_them(reference):
    """A build's accuracy rule has its graphs' logits (and, when it asks, their halting outputs)."""
    candidate = {"logits": reference["logits"].copy()}
    candidate["logits"][0, 0] = np.nan
    verdict = judge_cells({"logits": reference["logits"]}, candidate, INT8, "the FP32 graph")
    assert verdict.agreement.q_halt is None and not verdict.passed
    assert verdict.failures[0].startswith("the candidate's logits hold 11 non-finite values")
