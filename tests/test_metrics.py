"""hrm_deploy.metrics: one scoring for NumPy (verify, bench, precision) and torch (the trainer)."""

import numpy as np
import pytest
import torch

from hrm_deploy.metrics import IGNORE_LABEL_ID, accuracy, current_names, per_step_accuracy, row_scores, solved_rows

X = IGNORE_LABEL_ID
LABELS = np.array([[1, 2, 3], [1, 2, X], [X, X, X], [4, 4, 4]])
PREDICTIONS = np.array([[1, 2, 3], [1, 9, 7], [5, 5, 5], [4, 0, 4]])


def test_row_scores_ignore_unlabelled_cells():
    solved, token = row_scores(PREDICTIONS, LABELS)
    assert solved.tolist() == [True, False, True, False]  # a row with no labelled cell has nothing wrong
    assert token.tolist() == pytest.approx([1.0, 0.5, 0.0, 2 / 3])


def test_row_scores_agree_on_numpy_and_torch():
    solved, token = row_scores(torch.from_numpy(PREDICTIONS), torch.from_numpy(LABELS))
    expected_solved, expected_token = row_scores(PREDICTIONS, LABELS)
    assert solved.tolist() == expected_solved.tolist()
    assert token.numpy() == pytest.approx(expected_token)


def test_accuracy_and_per_step_curves():
    logits = np.eye(10)[PREDICTIONS]  # argmax = PREDICTIONS
    assert accuracy(logits, LABELS) == pytest.approx({"exact_accuracy": 0.5, "token_accuracy": 13 / 24, "count": 4})
    assert solved_rows(logits, LABELS).tolist() == [True, False, True, False]
    steps = np.stack([np.zeros_like(PREDICTIONS), PREDICTIONS], axis=1)  # [N, 2 steps, S]
    curves = per_step_accuracy(*row_scores(steps, LABELS[:, None, :]))
    assert curves["per_step_exact_accuracy"] == [0.25, 0.5]
    assert curves["per_step_token_accuracy"][1] == pytest.approx(13 / 24)


def test_current_names_renames_only_the_trainer_s_old_scalar_names():
    old = {"accuracy": 0.9, "eval": {"accuracy": 0.8}, "final_exact": 0.4, "per_step_exact": [0.4], "loss": 1.0}
    assert current_names(old) == {
        "token_accuracy": 0.9,
        "eval": {"token_accuracy": 0.8},
        "exact_accuracy": 0.4,
        "per_step_exact_accuracy": [0.4],
        "loss": 1.0,
    }
    bench_row = {"accuracy": {"exact_accuracy": 1.0, "token_accuracy": 1.0, "count": 2}}
    assert current_names(bench_row) == bench_row  # a dict under "accuracy" is already the new kind
