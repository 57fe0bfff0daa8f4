"""Data regenerated from a checkpoint's provenance: only what the command reads (calibrating on
128 puzzles never makes a 40,000-puzzle train split), the same puzzles as the full dataset's
first ones, and one line saying what was made and where."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from hrm_deploy.data.format import load_split
from hrm_deploy.model.checkpoint import save_checkpoint
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.hrm import build_model
from hrm_deploy.provenance import default_data
from tests.conftest import TINY

SPEC = {"generator": "sudoku", "train": 300, "test": 20, "blanks": [4, 8], "seed": 3, "augment": 0}


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("HRM_DEPLOY_CACHE", str(tmp_path / "cache"))
    model = build_model(HRMConfig(**TINY), seed=0)
    return save_checkpoint(tmp_path / "m.pt", model, dataset=SPEC)


def test_calibration_makes_only_the_puzzles_it_reads(checkpoint, caplog):
    with caplog.at_level(logging.INFO, logger="hrm_deploy.provenance"):
        cut = default_data(checkpoint, "--calib-data", {"train": 16})
    assert len(load_split(cut.path, "train")) == 16 and len(load_split(cut.path, "test")) == 1
    assert "16 train / 1 test puzzles this command reads" in cut.message
    assert any(
        "generated 17 sudoku puzzles" in r.getMessage() and str(cut.path) in r.getMessage() for r in caplog.records
    )
    full = default_data(checkpoint, "--data")  # every split, as before
    assert len(load_split(full.path, "train")) == 300
    # each puzzle has its own random stream: the cut split is the full split's first puzzles
    assert np.array_equal(load_split(cut.path, "train").inputs[:16], load_split(full.path, "train").inputs[:16])


def test_verify_reads_the_whole_test_split_only(checkpoint):
    choice = default_data(checkpoint, "--data", {"test": None})
    assert len(load_split(choice.path, "test")) == 20 and len(load_split(choice.path, "train")) == 1
