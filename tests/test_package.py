"""``hrm_deploy``'s lazy exports: every promised name resolves to the object its module defines,
without importing heavy libraries until it is asked for."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

import hrm_deploy


@pytest.mark.parametrize("name", sorted(hrm_deploy._LAZY))
def test_every_lazy_export_resolves(name):
    value = getattr(hrm_deploy, name)
    assert value is getattr(importlib.import_module(hrm_deploy._LAZY[name]), name)
    assert callable(value) and value.__name__ == name
    assert name in hrm_deploy.__all__


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        hrm_deploy.nope  # noqa: B018


def test_no_export_is_shadowed_by_a_submodule():
    """A name that is also a submodule would turn into the module once that module is imported."""
    for name in hrm_deploy._LAZY:
        assert importlib.util.find_spec(f"hrm_deploy.{name}") is None, name
