"""``scripts/`` and ``benchmarks/`` live by the package's habits: they use only its public names, and
every benchmark still starts (``--help``), so a refactor of the library cannot silently break them.

Lint, format and types over both folders run in ``.ci/run`` and pre-commit like the package's."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("scripts", "benchmarks")


def _sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(source: str) -> list[str]:
    """Each use of a private ``hrm_deploy`` name in ``source``: ``from hrm_deploy.x import _y``, a private
    module on the path (``hrm_deploy._x``), or ``module._y`` on a module or object imported from it."""
    tree = ast.parse(source)
    found: list[str] = []
    bound: set[str] = set()  # local names bound to something imported from hrm_deploy
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "hrm_deploy":
            module = node.module or ""
            found += [f"{module} (private module)" for part in module.split(".") if _private(part)][:1]
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{module}.{alias.name}")
                bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "hrm_deploy":
                    found += [f"{alias.name} (private module)" for part in alias.name.split(".") if _private(part)][:1]
                    bound.add((alias.asname or alias.name).split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in bound:
                found.append(f"{ast.unparse(node)}")
    return found


def test_the_rule_sees_private_names() -> None:
    source = (
        "from hrm_deploy.bench.run import _tile, bench\n"
        "import hrm_deploy.precision.calibrate as cal\n"
        "from hrm_deploy._x import y\n"
        "def f():\n    return cal._scales(bench._x), ok._hidden\n"
    )
    assert private_uses(source) == [
        "hrm_deploy.bench.run._tile",
        "hrm_deploy._x (private module)",
        "cal._scales",
        "bench._x",
    ]
    assert private_uses("from hrm_deploy.io import write_json\nclass A:\n    def __init__(self): self._x = 1\n") == []


def test_scripts_and_benchmarks_use_only_public_names() -> None:
    offenders = {str(path.relative_to(ROOT)): uses for path in _sources() if (uses := private_uses(path.read_text()))}
    assert not offenders, (
        f"private hrm_deploy names used outside the package (make them public or move the code in): {offenders}"
    )


def _benchmarks_with_a_main() -> list[Path]:
    return [p for p in sorted((ROOT / "benchmarks").glob("*.py")) if '__name__ == "__main__"' in p.read_text()]


@pytest.mark.slow
@pytest.mark.parametrize("script", _benchmarks_with_a_main(), ids=lambda p: p.stem)
def test_each_benchmark_starts(script: Path) -> None:
    # as a user runs it (python benchmarks/x.py): only the script's own folder is added to the path
    done = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage" in done.stdout.lower(), done.stdout[-500:]


@pytest.mark.slow
@pytest.mark.parametrize(
    "module",
    [p for p in sorted((ROOT / "benchmarks").glob("*.py")) if p not in _benchmarks_with_a_main()],
    ids=lambda p: p.stem,
)
def test_each_benchmark_helper_module_imports(module: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", f"import {module.stem}"],
        cwd=module.parent,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
