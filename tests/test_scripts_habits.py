"""``scripts/`` and ``benchmarks/`` live by the package's habits: they use only its public names, and
every benchmark still starts (``--help``), so a refactor of the library cannot silently break them.

Lint, format and types over both folders run in ``.ci/run`` and pre-commit like the package's."""

from __future__ import annotations

import ast
import json
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


def _benchmark_helpers() -> list[Path]:
    return [p for p in sorted((ROOT / "benchmarks").glob("*.py")) if p not in _benchmarks_with_a_main()]


def test_benchmarks_stand_on_their_own() -> None:
    """A benchmark imports nothing from tests/ and touches no sys.path: run as ``python benchmarks/x.py``
    its folder is on the path already (its helpers beside it), and hrm_deploy is installed."""
    found = {}
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        uses = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                uses += [a.name for a in node.names if a.name.split(".")[0] == "tests"]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tests":
                uses.append(node.module)
            elif isinstance(node, ast.Attribute) and node.attr == "path" and ast.unparse(node.value) == "sys":
                uses.append("sys.path")
        if uses:
            found[path.name] = uses
    assert not found, f"benchmarks that lean on tests/ or on sys.path: {found}"


# Every benchmark's --help and every helper's import, in ONE child process (torch and the package
# load once, not once per script), each as a user runs it: the script as __main__ with only its own
# folder added to the path. One JSON line per script: did it start, what it printed.
_STARTS = """
import contextlib, io, json, runpy, sys, traceback
folder, mains, helpers = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
sys.path.insert(0, folder)
for name in mains + helpers:
    out, code, error = io.StringIO(), 0, ""
    try:
        with contextlib.redirect_stdout(out):
            if name in mains:
                sys.argv = [f"{folder}/{name}.py", "--help"]
                runpy.run_path(sys.argv[0], run_name="__main__")
            else:
                __import__(name)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        code, error = 1, traceback.format_exc()[-2000:]
    print(json.dumps({"name": name, "code": code, "stdout": out.getvalue()[:500], "error": error}), flush=True)
"""


@pytest.fixture(scope="module")
def started() -> dict[str, dict]:
    mains = ",".join(p.stem for p in _benchmarks_with_a_main())
    helpers = ",".join(p.stem for p in _benchmark_helpers())
    done = subprocess.run(
        [sys.executable, "-c", _STARTS, str(ROOT / "benchmarks"), mains, helpers],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"name"')]
    assert done.returncode == 0 and rows, done.stderr[-3000:]
    return {row["name"]: row for row in rows}


@pytest.mark.slow
@pytest.mark.parametrize("script", _benchmarks_with_a_main(), ids=lambda p: p.stem)
def test_each_benchmark_starts(started: dict[str, dict], script: Path) -> None:
    row = started[script.stem]
    assert row["code"] == 0, row["error"] or row["stdout"]
    assert "usage" in row["stdout"].lower(), row["stdout"]


@pytest.mark.slow
@pytest.mark.parametrize("module", _benchmark_helpers(), ids=lambda p: p.stem)
def test_each_benchmark_helper_module_imports(started: dict[str, dict], module: Path) -> None:
    row = started[module.stem]
    assert row["code"] == 0 and not row["error"], row["error"]
