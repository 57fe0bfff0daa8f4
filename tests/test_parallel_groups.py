"""The suite's worker groups (tests/conftest.py): every name they give is a real place, and a test's
group is what the comments there say."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import FIRST, ONE_WORKER_FOLDERS, SPREAD, xdist_group

ROOT = Path(__file__).resolve().parents[1]


def test_every_named_group_and_module_exists():
    for folder in ONE_WORKER_FOLDERS:
        assert (ROOT / folder).is_dir(), folder
    for module in SPREAD:
        assert (ROOT / module).is_file(), module
    for group in FIRST:  # a renamed module would otherwise fall silently out of the head of the queue
        assert group in ONE_WORKER_FOLDERS.values() or (ROOT / group).is_file(), group


def test_a_tests_group():
    assert xdist_group("tests/scale/test_batch.py::test_x") == xdist_group("tests/scale/test_serve.py::T::t") == "ray"
    assert xdist_group("tests/backends/torch/test_torch_loop.py::test_x") == "torch-engines"
    spread = sorted(SPREAD)[0]
    assert xdist_group(f"{spread}::test_a[1]") != xdist_group(f"{spread}::test_a[2]")
    assert xdist_group("tests/test_verify.py::test_a") == xdist_group("tests/test_verify.py::test_b[x]")
