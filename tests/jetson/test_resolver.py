"""Both JetPack lines install: pip's own resolver, run for aarch64 and each line's Python without
installing anything (``pip install --dry-run --target DIR --report FILE --platform ... --python-version
... --only-binary=:all:``), resolves the core requirements plus the line's extra (torch is left out:
JetPack supplies it, and the light runtime does not need it) to wheels a board can install, with the
pins ``docs/jetson.md`` promises (cuda-python 12.x on JetPack 6, 13.x on JetPack 7; numpy 1.x on both)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from hrm_deploy.jetpack import LINES, JetPackLine, platform_tags

ROOT = Path(__file__).resolve().parents[2]
tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+: run the suite on Python 3.11 to check this")


def requirements(extra: str | None = None) -> list[str]:
    """The core dependencies (``extra`` None) or ``extra``'s own, from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"] if extra is None else project["optional-dependencies"][extra])


def _pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10).close()
    except OSError:
        return False
    return True


def resolve(line: JetPackLine, tmp_path: Path) -> dict[str, str]:
    """{distribution name (lowercase): the wheel file pip would install} for ``line``'s boards."""
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("\n".join(requirements() + requirements(line.extra)) + "\n")
    report = tmp_path / "report.json"
    platforms = [arg for tag in platform_tags(line) for arg in ("--platform", tag)]
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    cmd += ["--target", str(tmp_path / "target"), "--report", str(report), *platforms]
    cmd += ["--python-version", line.python, "--only-binary=:all:", "-r", str(reqs)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"pip could not resolve the {line.extra} extra for {line.name}:\n{done.stderr[-3000:]}"
    installs = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower(): i["download_info"]["url"].rsplit("/", 1)[-1] for i in installs}


def _version(wheel: str) -> tuple[int, ...]:
    return tuple(int(x) for x in wheel.split("-")[1].split(".")[:2] if x.isdigit())


@pytest.mark.slow
@pytest.mark.parametrize("line", LINES, ids=[line.extra for line in LINES])
def test_each_jetpack_line_resolves_for_aarch64(line, tmp_path):
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable from this machine: pip's resolver cannot run")
    wheels = resolve(line, tmp_path)
    tag = "cp" + line.python.replace(".", "")
    for name, wheel in wheels.items():  # pure Python, or built for this Python on aarch64
        assert wheel.endswith("-none-any.whl") or (tag in wheel and "aarch64" in wheel), (name, wheel)
    cuda_major = 12 if line.major == 6 else 13
    assert "cuda-python" in wheels and _version(wheels["cuda-python"])[0] == cuda_major, wheels.get("cuda-python")
    assert _version(wheels["numpy"])[0] == 1, wheels["numpy"]  # JetPack's TensorRT bindings: numpy 1.x
    assert "torch" not in wheels and "tensorrt" not in wheels  # both come from JetPack


def test_the_extras_name_the_lines_pins():
    """Fast and offline: the pins themselves (the resolver test shows they resolve)."""
    from packaging.specifiers import SpecifierSet

    for line in LINES:
        (pin,) = [r for r in requirements(line.extra) if r.startswith("cuda-python")]
        spec = SpecifierSet(pin[len("cuda-python") :])
        inside, outside = ("12.6.0", "13.0.0") if line.major == 6 else ("13.0.0", "12.9.1")
        assert inside in spec and outside not in spec, (line.extra, pin)  # a CUDA 13 driver for cuda-python 13
        (numpy,) = [r for r in requirements(line.extra) if r.startswith("numpy")]
        assert "2.0.0" not in SpecifierSet(numpy[len("numpy") :]), numpy


def test_docs_name_both_lines_and_their_extras():
    text = (ROOT / "docs" / "jetson.md").read_text()
    for line in LINES:
        assert line.name in text and f"[{line.extra}]" in text and f"Python {line.python}" in text
