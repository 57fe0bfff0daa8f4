"""Build options per backend come from the backend table: the precision of a build that asks for
none, and whether a checkpoint can be built from, are each row's; the command line names no backend
or target to pick them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hrm_deploy.engines.build import default_precision, refuse_checkpoint_source
from hrm_deploy.engines.request import GraphInput, builder
from hrm_deploy.errors import ConfigError
from hrm_deploy.registry import BACKENDS

ROOT = Path(__file__).resolve().parents[2]


def test_default_precision_is_the_building_rows():
    assert default_precision("desktop", None) == "fp16"  # TensorRT-RTX
    assert default_precision("datacenter", "tensorrt") == "fp16"
    assert default_precision("cpu", None) == "fp32"  # ONNX Runtime's CPU provider
    assert default_precision("desktop", "torch") == "fp32"


def test_a_row_says_it_builds_from_a_checkpoint_exactly_when_its_builder_takes_the_source():
    for entry in BACKENDS.values():
        if entry.builder:
            takes = builder(entry.builds_for[0]).takes
            assert entry.builds_from_checkpoint == (takes is GraphInput.SOURCE), entry.name


def test_a_checkpoint_is_refused_in_one_line_by_backends_that_build_from_onnx(tmp_path):
    from hrm_deploy.train.presets import bundled_checkpoint

    checkpoint = Path(bundled_checkpoint("sudoku-tiny"))
    with pytest.raises(ConfigError, match=r"is a checkpoint; the cpu target builds from an ONNX graph"):
        refuse_checkpoint_source(checkpoint, "cpu", None)
    with pytest.raises(ConfigError, match=r"is a checkpoint; TensorRT builds from an ONNX graph.*--backend torch"):
        refuse_checkpoint_source(checkpoint, "desktop", None)
    refuse_checkpoint_source(checkpoint, "desktop", "torch")  # PyTorch compiles the checkpoint itself


def test_the_build_command_names_no_backend_or_target():
    tree = ast.parse((ROOT / "hrm_deploy" / "cli" / "engine.py").read_text())
    names = {"torch", "cpu", "ort", "tensorrt", "tensorrt-rtx"}  # (the --target default is an option default)
    found = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in names]
    assert not found, f"cli/engine.py picks by name: {found}; read the backend table's row instead"
