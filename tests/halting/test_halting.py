"""Early halting: rules, the step driver (ORT step graph and PyTorch reference), continuous
batching and budget calibration. Multi-step behaviour uses the random 4-step tiny model."""

import numpy as np
import pytest

from hrm_deploy.errors import ConfigError
from hrm_deploy.halting import (
    HaltMode,
    HaltRule,
    calibrate_threshold,
    drive,
    exact_at,
    run_continuous,
    simulate_steps,
)


def test_parse_rules_and_bad_text():
    assert HaltRule.parse("off").mode is HaltMode.OFF
    assert HaltRule.parse("q").mode is HaltMode.Q
    rule = HaltRule.parse("threshold:0.7", min_steps=2, max_steps=5)
    assert (rule.threshold, rule.min_steps, rule.max_steps) == (0.7, 2, 5)
    assert HaltRule.parse("budget:1.5").budget == 1.5 and HaltRule.parse("budget:1").threshold is None
    for bad in ("sometimes", "threshold", "threshold:x", "threshold:1.5", "q:3", "budget:-1"):
        with pytest.raises(ConfigError, match="--halt") as err:
            HaltRule.parse(bad)
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="min-steps"):
        HaltRule.parse("q", min_steps=3, max_steps=2)


def test_should_halt_semantics():
    qh = np.array([2.0, -2.0, 0.5, 0.0], np.float32)
    qc = np.array([1.0, -1.0, 1.0, -0.1], np.float32)
    assert HaltRule.parse("q").should_halt(2, qh, qc).tolist() == [True, False, False, True]
    # sigmoid(2)=0.88, sigmoid(-2)=0.12, sigmoid(.5)=0.62, sigmoid(0)=0.5
    assert HaltRule.parse("threshold:0.6").should_halt(2, qh, qc).tolist() == [True, False, True, False]
    assert not HaltRule.parse("q", min_steps=3).should_halt(2, qh, qc).any()
    assert HaltRule.parse("off", max_steps=2).should_halt(2, qh, qc).all()  # max_steps halts everything
    assert HaltRule.parse("off").should_halt(4, qh, qc, total_steps=4).all()  # the final step always halts
    # one step per row (continuous batching): min_steps applies per row
    assert HaltRule.parse("q", min_steps=2).should_halt(np.array([1, 2, 1, 2]), qh, qc).tolist() == [
        False,
        False,
        False,
        True,
    ]
    with pytest.raises(ConfigError, match="calibrated threshold"):
        HaltRule.parse("budget:1").should_halt(1, qh, qc)


@pytest.fixture
def random_ckpt(tiny_model, tmp_path):
    from hrm_deploy.model.checkpoint import save_checkpoint

    return save_checkpoint(tmp_path / "rand.pt", tiny_model)


@pytest.fixture
def feeds():
    rng = np.random.default_rng(3)
    return {"inputs": rng.integers(1, 11, size=(12, 81), dtype=np.int32), "puzzle_identifiers": np.zeros(12, np.int32)}


class _median_rule:
    """A row-local rule that splits this batch's rows over several halting steps: halt above
    each step's median q_halt of an all-step run (a random model's q barely varies by row)."""

    def __init__(self, full: dict[str, np.ndarray]):
        self.medians = np.median(full["q_halt_logits"], axis=0)

    def should_halt(self, step, q_halt, q_continue):
        return q_halt > self.medians[np.asarray(step) - 1]


def _check_rows_match_alone(halted, alone_fn, feeds):
    """Every halted row equals that row run alone (batch 1) to its halting step."""
    used = halted["steps_used"]
    assert len(set(used.tolist())) > 1, "the rule should stop rows at different steps"
    for row in range(len(used)):
        alone = alone_fn({k: v[row : row + 1] for k, v in feeds.items()}, int(used[row]))
        np.testing.assert_allclose(halted["logits"][row], alone, rtol=1e-4, atol=1e-4)
        assert (halted["logits"][row].argmax(-1) == alone.argmax(-1)).all()
        assert np.isnan(halted["q_halt_logits"][row, used[row] :]).all()
        assert (halted["step_predictions"][row, used[row] :] == -1).all()


@pytest.mark.slow
def test_torch_reference_halting_equals_each_row_run_alone(random_ckpt, tiny_model, feeds):
    import torch

    from hrm_deploy.backends.reference import TorchRunner
    from hrm_deploy.export.unroll import unroll

    runner = TorchRunner(random_ckpt)
    runner.activate()
    full = runner.infer(feeds)
    rule = _median_rule(full)
    halted = runner.infer(feeds, halt=rule.should_halt)
    assert halted["steps_used"].dtype == np.int32
    # the driver's steps agree with simulating a rule on the all-step outputs
    q_rule = HaltRule.parse("q")
    assert (
        simulate_steps(q_rule, full["q_halt_logits"], full["q_continue_logits"])
        == runner.infer(feeds, halt=q_rule.should_halt)["steps_used"]
    ).all()

    def alone(row_feeds, steps):
        with torch.inference_mode():
            out = unroll(tiny_model, steps)(
                torch.from_numpy(row_feeds["inputs"]), torch.from_numpy(row_feeds["puzzle_identifiers"])
            )
        return out[0].numpy()[0]

    _check_rows_match_alone(halted, alone, feeds)
    runner.close()


@pytest.fixture
def random_step_onnx(random_ckpt, tmp_path):
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx

    return export_onnx(
        random_ckpt, tmp_path / "rand.step.onnx", ExportConfig(mode="step", parity=False), quiet=True
    ).path


@pytest.mark.slow
def test_ort_step_graph_halting_equals_each_row_run_alone(random_step_onnx, feeds):
    from hrm_deploy.backends.ort.runner import OrtRunner

    runner = OrtRunner(random_step_onnx)
    runner.activate()
    full = runner.infer(feeds)
    assert (full["steps_used"] == 4).all()
    rule = _median_rule(full)
    halted = runner.infer(feeds, halt=rule.should_halt)
    step_fn = runner.step_function()

    def alone(row_feeds, steps):
        out = drive(
            step_fn,
            row_feeds["inputs"],
            row_feeds["puzzle_identifiers"],
            HaltRule(HaltMode.OFF, max_steps=steps).should_halt,
        )
        assert out["steps_used"][0] == steps
        return out["logits"][0]

    _check_rows_match_alone(halted, alone, feeds)
    # masking halted rows instead of dropping them gives the same answers
    masked = drive(step_fn, feeds["inputs"], feeds["puzzle_identifiers"], rule.should_halt, compact=False)
    assert (masked["steps_used"] == halted["steps_used"]).all()
    np.testing.assert_allclose(masked["logits"], halted["logits"], rtol=1e-4, atol=1e-4)
    runner.close()


@pytest.mark.slow
def test_continuous_batching_gives_the_one_by_one_answers(random_step_onnx, random_ckpt, feeds):
    from hrm_deploy.backends.ort.runner import OrtRunner
    from hrm_deploy.backends.reference import TorchRunner

    for runner in (OrtRunner(random_step_onnx), TorchRunner(random_ckpt)):
        runner.activate()
        rule = _median_rule(runner.infer(feeds))
        step_fn = runner.step_function()
        stream = run_continuous(step_fn, feeds["inputs"], feeds["puzzle_identifiers"], 3, rule.should_halt)
        assert len(set(stream["steps_used"].tolist())) > 1
        for row in range(len(feeds["inputs"])):
            one = drive(
                step_fn, feeds["inputs"][row : row + 1], feeds["puzzle_identifiers"][row : row + 1], rule.should_halt
            )
            assert stream["steps_used"][row] == one["steps_used"][0], runner.name
            np.testing.assert_allclose(stream["logits"][row], one["logits"][0], rtol=1e-4, atol=1e-4)
            np.testing.assert_array_equal(stream["step_predictions"][row], one["step_predictions"][0])
        runner.close()


def _synthetic(n, rng, steps=8, seq=5):
    """Rows whose answer becomes right at a random step; q_halt rises with being right (noisily)."""
    right_from = rng.integers(1, steps + 2, size=n)  # steps + 1: never right
    labels = rng.integers(0, 9, size=(n, seq))
    preds = np.repeat(labels[:, None, :], steps, 1).copy()
    step_idx = np.arange(1, steps + 1)[None, :]
    wrong = step_idx < right_from[:, None]
    preds[wrong, 0] = (labels[:, None, 0].repeat(steps, 1)[wrong] + 1) % 9
    q_halt = np.where(wrong, -1.0, 1.0) + rng.normal(0, 1.2, size=(n, steps))
    return q_halt.astype(np.float32), np.zeros((n, steps), np.float32), preds.astype(np.int32), labels


@pytest.mark.slow
def test_budget_calibration_respects_p_on_held_out_data():
    rng = np.random.default_rng(0)
    calib, held_out = _synthetic(4000, rng), _synthetic(4000, rng)
    for budget in (0.5, 2.0, 5.0):
        found = calibrate_threshold(*calib, budget_points=budget)
        assert found["loss_points"] <= budget + 1e-9
        assert found["mean_steps"] < 8  # the budget buys fewer steps
        rule = HaltRule(HaltMode.THRESHOLD, found["threshold"])
        q_halt, q_cont, preds, labels = held_out
        full = exact_at(preds, np.full(len(labels), 8, np.int32), labels).mean()
        used = simulate_steps(rule, q_halt, q_cont)
        loss = 100 * (full - exact_at(preds, used, labels).mean())
        assert loss <= budget + 1.0, (budget, loss)  # sampling noise of 4000 rows: well under a point
    zero = calibrate_threshold(*calib, budget_points=0.0)
    assert zero["loss_points"] <= 1e-9
