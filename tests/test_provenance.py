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


def test_a_process_that_makes_the_same_data_first_is_no_error(checkpoint, monkeypatch):
    """Two commands regenerating the same dataset at once (two test workers, two shells): the one
    whose folder lands second keeps the first one's (same spec, same data) and goes on."""
    import os
    import shutil
    from pathlib import Path

    import hrm_deploy.provenance as provenance

    rename = os.replace

    def the_other_process_lands_first(made, folder):
        if Path(made).name == "data":  # the dataset folder's rename, not a file's
            shutil.copytree(made, folder)  # between this process's check and its rename
        rename(made, folder)

    monkeypatch.setattr(provenance.os, "replace", the_other_process_lands_first)
    choice = default_data(checkpoint, "--data", {"test": None})
    assert len(load_split(choice.path, "test")) == 20
    assert [p.name for p in Path(choice.path).parent.iterdir()] == [Path(choice.path).name]  # no work folder left


def test_an_exports_record_of_the_data_spares_reading_its_checkpoint(checkpoint, tmp_path):
    """The export's manifest records the checkpoint's dataset spec: a command on the export finds
    the same data without reading the checkpoint (no torch import: a second off every quantized
    build); an export made before the record existed still finds it, from the checkpoint."""
    import os
    import subprocess
    import sys

    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.manifest import read_manifest, update_manifest

    graph = export_onnx(checkpoint, tmp_path / "m.onnx", ExportConfig(parity=False), quiet=True).path
    assert read_manifest(graph)["source"]["data"] == {"dataset": SPEC, "data_path": None}
    expected = default_data(checkpoint, "--data", {"test": None}).path
    probe = (
        "import sys; from hrm_deploy.provenance import default_data; "
        f"print(default_data({str(graph)!r}, '--data', {{'test': None}}).path); "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=os.environ.copy(), check=True
    )
    assert done.stdout.split() == [str(expected), "False"]
    source = {k: v for k, v in read_manifest(graph)["source"].items() if k != "data"}
    update_manifest(graph, source=source)  # as an older export wrote it
    assert default_data(graph, "--data", {"test": None}).path == expected
