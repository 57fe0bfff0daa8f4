"""The family seam: outside ``hrm_deploy/model/`` a stored config is read only through
``families.config_from_dict``, which picks the family's class (calling a family's own
``from_dict`` reads every graph as that family: the cpu target once refused every TRM graph so)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("hrm_deploy", "benchmarks", "scripts")


def _family_from_dict_calls(path: Path) -> list[str]:
    """``X.from_dict(...)`` calls where X is a name or attribute ending in ``Config`` (a family's class)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_dict":
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if name.endswith("Config") and name not in ("QuantConfig",):
                found.append(f"{path}:{node.lineno} {name}.from_dict")
    return found


@pytest.mark.slow
def test_no_module_outside_model_reads_a_config_with_a_familys_from_dict():
    calls = [
        call
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if not path.is_relative_to(ROOT / "hrm_deploy" / "model")
        for call in _family_from_dict_calls(path)
    ]
    assert not calls, "read stored configs with hrm_deploy.model.families.config_from_dict:\n" + "\n".join(calls)


def test_the_checker_sees_a_family_from_dict_call(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f(meta):\n    from m import HRMConfig\n    return HRMConfig.from_dict(meta['config'])\n")
    assert len(_family_from_dict_calls(sample)) == 1
