"""The accuracy rule of every quantized build (hrm_deploy/precision/rule.py): losses and gains in
words, what verify judges (q_halt signs, halting steps) and non-finite outputs in the rule, margins
that decide whether a holdout settles the verdict, the bound that makes a failure certain before
every puzzle ran; and the holdout (precision/holdout.py) that runs FP32 once per puzzle and a
candidate on the puzzles FP32 was least sure of first."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from hrm_deploy.data.examples import Examples
from hrm_deploy.precision.holdout import CHUNK, GROWTH, Holdout, growth_cap
from hrm_deploy.precision.registry import PRECISIONS
from hrm_deploy.precision.rule import Comparison, Outputs, Quality, Rule, fragile_order, verify_view

INT8 = Rule.of("int8")


def test_losses_and_gains_are_words_not_signs():
    lost = Quality(300, 99.0, fp32_exact=91.0, exact=90.0, lost=6, gained=3).describe()
    gained = Quality(64, 96.84, fp32_exact=72.5, exact=74.06, lost=1, gained=2).describe()
    assert "1.00 points lost: 6 puzzles lost, 3 gained" in lost and "+" not in lost and "-" not in lost
    assert "1.56 points gained: 1 puzzles lost, 2 gained" in gained and "-" not in gained


def test_the_loss_is_counted_from_the_paired_flips():
    """3 net puzzles of 300 are exactly the 1-point budget (the accuracies' difference is not, in floats)."""
    q = Quality(300, 99.9, fp32_exact=94.333333, exact=93.333333, lost=5, gained=2)
    assert q.loss == 1.0 and INT8.within(q)


def test_a_holdout_where_one_puzzle_is_over_the_budget_cannot_decide_it():
    """64 puzzles (one is 1.56 points) never settle a 1-point budget, whatever was seen; 300 clean
    ones do; flips on both sides leave a small measured loss within the noise."""
    clean = {"agreement": 100.0, "agreement_margin": 0.01}
    assert not INT8.settled(Quality(64, fp32_exact=90.0, exact=90.0, **clean))
    assert INT8.settled(Quality(300, fp32_exact=90.0, exact=90.0, **clean))
    assert not INT8.settled(Quality(300, fp32_exact=91.0, exact=90.33, lost=6, gained=4, **clean))
    assert INT8.settled(Quality(300, fp32_exact=90.0, exact=80.0, lost=30, **clean))  # clearly outside
    assert not INT8.settled(Quality(10, **clean))  # no labels: 10 rows cannot show 95 % q_halt signs
    assert INT8.settled(Quality(300, **clean))


def test_the_rule_judges_what_verify_judges_at_the_precisions_thresholds():
    """q_halt signs and, for a graph that halts inside, the halting steps, at the INT8 row's
    thresholds; a non-finite output fails whatever else holds."""
    good = Quality(300, 99.9, q_halt_agreement=99.0, steps_agreement=99.0, fp32_exact=90.0, exact=90.0)
    assert INT8.within(good)
    q_signs = replace(good, q_halt_agreement=94.0)
    steps = replace(good, steps_agreement=78.0)
    nan = replace(good, nonfinite=3)
    assert INT8.failures(q_signs) == ["q_halt sign agreement % 94.00 (needs >= 95)"]
    assert INT8.failures(steps) == ["halting steps agreement % 78.00 (needs >= 95)"]
    assert INT8.failures(nan) == ["non-finite output values 3.00 (needs <= 0)"]
    assert INT8.settled(nan)  # a NaN is never noise
    names = [c.name for c in verify_view(good, PRECISIONS["int8"].thresholds)]
    assert names[:3] == ["argmax agreement %", "q_halt sign agreement %", "halting steps agreement %"]
    assert "halting steps agreement %" not in [
        c.name for c in verify_view(replace(good, steps_agreement=None), INT8.thresholds)
    ]
    loose = replace(INT8.thresholds, min_q_halt_sign_agreement=0.9)  # the row's thresholds decide
    assert Rule(1.0, loose).within(q_signs)


def _outputs(
    answers: np.ndarray, q: np.ndarray | None = None, steps: np.ndarray | None = None, sure: bool = False
) -> Outputs:
    """Outputs answering ``answers`` [N, S]: each cell's answer 1.0, every other value 0.9 (unsure:
    its top-1 minus top-2 margin 0.1 of the scale, a flip verify excuses) or, ``sure``, 0.0."""
    n = len(answers)
    heads = {
        "logits": (0.0 if sure else 0.9) + (1.0 if sure else 0.1) * np.eye(10, dtype=np.float32)[answers],
        "q_halt_logits": np.ones((n, 2), np.float32) if q is None else q,
        "q_continue_logits": np.zeros((n, 2), np.float32),
    }
    if steps is not None:
        heads["steps_used"] = steps
    return Outputs.of(heads)


def test_a_loop_graphs_nan_after_halting_is_its_contract_any_other_is_counted():
    answers = np.ones((3, 4), np.int64)
    q = np.array([[1.0, np.nan], [1.0, 2.0], [np.nan, 1.0]], np.float32)  # row 0 halted after step 1
    out = _outputs(answers, q, np.array([1, 2, 2], np.int32))
    assert out.nonfinite.tolist() == [0, 0, 1]
    logits = _outputs(answers).logits.copy()
    logits[1, 2, 3] = np.inf
    assert Outputs.of(
        {"logits": logits, "q_halt_logits": np.ones(3), "q_continue_logits": np.ones(3)}
    ).nonfinite.tolist() == [0, 1, 0]


def test_an_answer_flipped_where_fp32_was_sure_fails_the_rule_as_it_fails_verify():
    """Verify's cell judgement, row by row: one cell flipped where FP32 was sure (top-1 minus top-2
    the whole scale) fails the rule however many cells agree; the same flip where FP32 hesitated (0.1
    of the scale) is excused, and a subset of rows is judged at its own scale."""
    from hrm_deploy.agreement import judge_cells

    answers = np.ones((300, 81), np.int64)
    flipped = answers.copy()
    flipped[7, 3] = 2
    sure, moved = _outputs(answers, sure=True), _outputs(flipped, sure=True)
    found = Comparison.of(sure, moved, answers).quality()
    assert found.agreement > 99.99 and found.sure_flip == 1.0
    assert INT8.failures(found) == ["FP32's margin at a flipped answer (of the scale) 1 (needs <= 0.6)"]
    assert INT8.settled(found)  # one row decides it: no margin
    verdict = judge_cells(sure.heads(), moved.heads(), INT8.thresholds)  # verify, on the same outputs
    assert not verdict.passed and any("flipped where the reference was sure" in line for line in verdict.failures)
    unsure = Comparison.of(_outputs(answers), _outputs(flipped), answers).quality()
    assert unsure.sure_flip == pytest.approx(0.1 / 1.0, rel=1e-5) and INT8.within(unsure)
    assert judge_cells(_outputs(answers).heads(), _outputs(flipped).heads(), INT8.thresholds).passed
    rows = Comparison.of(sure, moved, answers).rows()  # the columns a holdout keeps per row
    assert Comparison.from_rows({k: v[5:10] for k, v in rows.items()}, 81).quality().sure_flip == 1.0


def test_a_garbage_position_fails_the_rule_without_labels_and_where_its_answer_agrees():
    """One position wrong on every puzzle: answered confidently wrong (no labels; 80 of 81 cells agree,
    98.8 % over the 98 % the INT8 row asks) fails on FP32's margin where it flipped; a position whose
    answer still agrees but whose logits are far off (5x the scale) fails on the cell error."""
    answers = np.ones((64, 81), np.int64)
    sure = _outputs(answers, sure=True)
    wrong = answers.copy()
    wrong[:, 40] = 7
    found = Comparison.of(sure, _outputs(wrong, sure=True), None).quality()
    assert 98.0 < found.agreement < 99.0 and found.sure_flip == 1.0 and not INT8.within(found)
    far = _outputs(answers, sure=True)
    far.logits[:, 40, :] *= 5.0  # the same argmax, every value 5x FP32's
    found = Comparison.of(sure, far, None).quality()
    assert found.agreement == 100.0 and found.cell_error > 2 * 0.6 and not INT8.within(found)
    assert any(line.startswith("a cell's logit error") for line in INT8.failures(found))


def _examples(count: int) -> Examples:
    rng = np.random.default_rng(0)
    labels = rng.integers(1, 10, (count, 4))
    return Examples(labels.astype(np.int32), np.arange(count, dtype=np.int32), labels, "pool", "")  # ids: positions


def test_the_holdout_grows_until_the_verdict_is_clear_then_stops(tmp_path):
    """FP32 solves every puzzle; the candidate misses none: 64 puzzles cannot settle the budget, the
    holdout doubles (FP32's answers computed once per puzzle) until it does."""
    pool = _examples(1000)
    runs: list[tuple[str, int]] = []

    def run(path: Path, examples: Examples) -> Outputs:
        runs.append((path.name, len(examples)))
        return _outputs(examples.labels)

    candidate = tmp_path / "int8.onnx"
    candidate.write_bytes(b"graph")
    holdout = Holdout(tmp_path / "fp32.onnx", pool, run, 64, growth_cap(64))
    quality, how = holdout.decide(candidate, INT8, 64, holdout.cap)
    assert quality.puzzles == 256 and how.settled and INT8.within(quality)
    assert sum(n for name, n in runs if name == "fp32.onnx") == 256  # each puzzle's reference once
    assert sum(n for name, n in runs if name == "int8.onnx") == 256  # and the candidate's: grown, not rerun
    candidate.write_bytes(b"another graph")  # a new file at the same path is measured afresh
    holdout.measure(candidate, 256)
    assert sum(n for name, n in runs if name == "int8.onnx") == 512
    assert growth_cap(64) == GROWTH * 64


def test_a_certain_failure_stops_early_and_a_pass_needs_the_whole_holdout(tmp_path):
    """Every puzzle lost: after one run call the loss is outside the budget by more than its margin
    even if no other puzzle were lost (FP32 solves them all: none could be gained), so the holdout
    does not grow either; a candidate that loses nothing runs every puzzle."""
    pool = _examples(1000)
    ran: dict[str, int] = {}

    def run(path: Path, examples: Examples) -> Outputs:
        answers = examples.labels.copy()
        if path.name == "bad.onnx":
            answers[:, 0] = 0  # every puzzle lost
        ran[path.name] = ran.get(path.name, 0) + len(examples)
        return _outputs(answers)

    for name in ("bad.onnx", "good.onnx"):
        (tmp_path / name).write_bytes(name.encode())
    holdout = Holdout(tmp_path / "fp32.onnx", pool, run, 300, 1200)
    bad, how = holdout.decide(tmp_path / "bad.onnx", INT8, 300, 1200)
    assert bad.puzzles == CHUNK and ran["bad.onnx"] == CHUNK and how.settled and not INT8.within(bad)
    assert f"failure certain after {CHUNK} of 300 puzzles" in how.why
    good, how = holdout.decide(tmp_path / "good.onnx", INT8, 300, 1200)
    assert good.puzzles == 300 and ran["good.onnx"] == 300 and how.settled and INT8.within(good)


def test_the_bound_of_a_measurement_under_way():
    """What the puzzles not yet run could do at best: agree everywhere, and gain every puzzle FP32
    does not solve. A failure is certain when that best still fails: clearly before the last size
    of the holdout (argmax agreement, whose margin comes from the spread of rates, never clearly),
    at all at the last. A screen passes with one more failure of each kind to spare."""
    seen = Quality(100, 99.0, q_halt_agreement=90.0, fp32_exact=80.0, exact=78.0, lost=3, gained=1)
    best = seen.completed(200, 10)
    assert best.puzzles == 300 and best.gained == 11 and best.q_halt_agreement == pytest.approx(100 - 10 / 3)
    assert best.agreement == pytest.approx(100 - 1 / 3) and best.loss < 0
    q_flips = replace(seen, lost=0, gained=0).completed(200, 0)  # 10 q_halt signs flipped of 300: 96.67 %
    assert not INT8.certainly_fails(q_flips, final=True)
    worse = Quality(100, 99.0, q_halt_agreement=84.0, fp32_exact=80.0, exact=80.0).completed(200, 0)  # 16 of 300
    assert INT8.certainly_fails(worse, final=True) and not INT8.certainly_fails(worse, final=False)
    clear = Quality(100, 99.0, q_halt_agreement=70.0, fp32_exact=80.0, exact=80.0).completed(200, 0)  # 30 of 300
    assert INT8.certainly_fails(clear, final=False)
    cells = Quality(100, 90.0, fp32_exact=80.0, exact=80.0).completed(10, 0)  # agreement 90.9 %: never clear
    assert INT8.certainly_fails(cells, final=True) and not INT8.certainly_fails(cells, final=False)
    screen = Quality(300, 99.9, q_halt_agreement=100.0, fp32_exact=80.0, exact=79.33, lost=2)
    assert INT8.within(screen.one_more())  # 3 of 300: exactly the budget
    assert INT8.within(replace(screen, lost=3)) and not INT8.within(replace(screen, lost=3).one_more())


def test_fp32s_least_sure_puzzles_come_first():
    """The order a candidate runs: by the smaller of the ranks of the least sure cell (top-1 minus
    top-2 over the largest |logit|) and of |q_halt|; ties by index; a NaN q_halt counts as sure."""
    logits = np.zeros((4, 2, 3), np.float32)
    logits[:, :, 0] = 1.0
    logits[2, 1] = [1.0, 0.95, 0.0]  # puzzle 2: one cell nearly tied
    q = np.array([[3.0], [0.01], [5.0], [np.nan]], np.float32)  # puzzle 1: q_halt near 0
    out = Outputs.of({"logits": logits, "q_halt_logits": q, "q_continue_logits": q})
    order = fragile_order(out).tolist()
    assert order[:2] == [1, 2] and sorted(order) == [0, 1, 2, 3]


def test_at_the_cap_the_measured_values_decide_and_the_record_says_so(tmp_path):
    """64 puzzles with 3 lost (4.7 points, within the noise) grow to the cap, 100, where the measured
    values decide: 3 of 100 lost is outside the budget whatever the rest does, so the measurement
    stops after the first run call of the new puzzles."""
    pool = _examples(100)

    def run(path: Path, examples: Examples) -> Outputs:
        answers = examples.labels.copy()
        if path.name == "int8.onnx":  # puzzles 0, 25, 50, 75 lost, whichever slice is run
            answers[examples.puzzle_identifiers % 25 == 0, 0] = 0
        return _outputs(answers)

    (tmp_path / "int8.onnx").write_bytes(b"graph")
    holdout = Holdout(tmp_path / "fp32.onnx", pool, run, 64, 256)
    quality, how = holdout.decide(tmp_path / "int8.onnx", INT8, 64, 256)
    assert quality.lost == 3 and quality.puzzles == 64 + CHUNK and not INT8.within(quality)
    assert not how.settled and f"failure certain after {64 + CHUNK} of 100 puzzles" in how.why
    assert "measured values decide" in how.why


def test_a_screen_runs_only_the_rows_asked_and_counts_the_rest_as_fp32(tmp_path):
    pool = _examples(300)
    ran: list[int] = []

    def run(path: Path, examples: Examples) -> Outputs:
        answers = examples.labels.copy()
        if path.name == "mix.onnx":
            answers[examples.puzzle_identifiers < 3, 0] = 0  # puzzles 0, 1 and 2 lost
        ran.append(len(examples))
        return _outputs(answers)

    (tmp_path / "mix.onnx").write_bytes(b"graph")
    holdout = Holdout(tmp_path / "fp32.onnx", pool, run, 300, 300)
    holdout.reference(300)
    ran.clear()
    screened = holdout.measure_rows(tmp_path / "mix.onnx", np.array([1, 2, 40]), 300)
    assert sum(ran) == 3 and screened.puzzles == 300 and screened.lost == 2  # puzzle 0 was not screened
    assert screened.loss == pytest.approx(100 * 2 / 300)
