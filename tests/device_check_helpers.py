"""Loading the GPU check scripts and the benchmarks in tests (neither scripts/ nor benchmarks/ is a
package: each runs as ``python <folder>/<name>.py``, which puts its folder on ``sys.path``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load(name: str, path: Path) -> ModuleType:
    """The module at ``path`` as ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, its imports of the modules beside it resolved as when it runs as a
    script (the folder is on ``sys.path`` while it loads)."""
    folder = str(ROOT / "benchmarks")
    sys.path.insert(0, folder)
    try:
        return load(name, ROOT / "benchmarks" / f"{name}.py")
    finally:
        sys.path.remove(folder)


def load_check(name: str, monkeypatch) -> ModuleType:
    """``scripts/<name>.py`` with scripts/ on sys.path; its shared library as ``module.lib``."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    module = load(name, ROOT / "scripts" / f"{name}.py")
    module.lib = sys.modules["device_check_lib"]
    return module
