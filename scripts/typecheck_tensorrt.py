"""Type-check the TensorRT code path (``hrm_deploy.engines``, the backend it shares with the
runners in ``hrm_deploy.backends.tensorrt.api``, and the runners' engine path) with mypy against the
``tensorrt-stubs`` package (TensorRT 10.x API, the Jetson JetPack 6 generation), then the
TensorRT-RTX path against stubs generated from the installed ``tensorrt_rtx`` module.

``Backend.trt`` is ``Any`` at run time (one attribute holds either module). For the RTX pass the
script copies ``hrm_deploy`` to a temporary folder and types every ``backend.trt`` /
``self.trt`` as the ``tensorrt_rtx`` module (and the TYPE_CHECKING ``import tensorrt`` as
``tensorrt_rtx``), line numbers unchanged, so each RTX attribute, method and argument is checked
(``stubgen`` reads the pybind11 signatures; the few it cannot type become ``Any``). The pass is
skipped, saying so, where ``tensorrt_rtx`` is not installed.

The stubs ship without a py.typed marker under ``tensorrt/`` and have a few signatures mypy cannot parse
(the keyword ``in`` as a parameter name, a required parameter after defaulted ones). This copies them into a
temporary stub folder with those names fixed and points mypy at it.

    python scripts/typecheck_tensorrt.py      # exit status = mypy's
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHECKED = [
    "hrm_deploy/engines",
    "hrm_deploy/backends/tensorrt",
    "hrm_deploy/runtime/compat.py",
    "hrm_deploy/runtime/adapter.py",
    "hrm_deploy/runtime/device_loop.py",
    "hrm_deploy/runtime/memory",
]
# the builders and the API they share with the runner (tests/backends/tensorrt checks the adapter's names)
RTX_CHECKED = ["hrm_deploy/engines", "hrm_deploy/backends/tensorrt/builder", "hrm_deploy/backends/tensorrt/api.py"]


def stub_root() -> Path | None:
    spec = importlib.util.find_spec("tensorrt_stubs")
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent.parent


def _mypy(paths: list[str], cwd: Path, stub_path: str) -> tuple[int, list[str], str]:
    """(exit status when mypy itself failed else 0, our lines, output tail)."""
    env = {**os.environ, "MYPYPATH": stub_path}
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--follow-imports=silent",
        "--no-incremental",
        "--ignore-missing-imports",
        *paths,
    ]
    run = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    # mypy also reports the stubs' own inconsistencies (pybind11-generated); only ours count.
    ours = [line for line in run.stdout.splitlines() if line.startswith("hrm_deploy/")]
    blocked = "errors prevented further checking" in run.stdout  # e.g. a stub syntax error: nothing was checked
    crashed = run.returncode if (blocked or "error:" not in run.stdout) and run.returncode != 0 else 0
    return crashed, ours, run.stdout[-2000:] + run.stderr[-2000:]


def typed_rtx_copy(repo: Path, dest: Path) -> None:
    """Copy hrm_deploy to ``dest`` with ``backend.trt`` / ``self.trt`` typed as the tensorrt_rtx module."""
    shutil.copytree(repo / "hrm_deploy", dest / "hrm_deploy", ignore=shutil.ignore_patterns("__pycache__"))
    for path in [
        *(dest / "hrm_deploy" / "engines").glob("*.py"),
        *(dest / "hrm_deploy" / "backends" / "tensorrt").rglob("*.py"),
    ]:
        text = path.read_text()
        if "backend.trt" not in text and "self.trt" not in text:
            continue
        # same line count: the import joins the __future__ line
        text = text.replace(
            "from __future__ import annotations",
            "from __future__ import annotations; import tensorrt_rtx as _rtx_api",
            1,
        )
        text = re.sub(r"^(\s+)import tensorrt$", r"\1import tensorrt_rtx as tensorrt", text, flags=re.MULTILINE)
        text = text.replace("backend.trt", "_rtx_api").replace("self.trt", "_rtx_api")
        path.write_text(text)


def check_rtx(repo: Path, tmp: Path) -> int:
    if importlib.util.find_spec("tensorrt_rtx") is None:
        print("tensorrt_rtx is not installed: the TensorRT-RTX pass is skipped")
        return 0
    stubs = tmp / "rtx_stubs"
    # mypy is mypyc-compiled: `python -m mypy.stubgen` has no code object, its main() works
    gen = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from mypy.stubgen import main; main(sys.argv[1:])",
            "-p",
            "tensorrt_rtx_bindings",
            "-p",
            "tensorrt_rtx",
            "-o",
            str(stubs),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if gen.returncode != 0:
        print(gen.stdout[-2000:] + gen.stderr[-2000:], file=sys.stderr)
        return gen.returncode
    for stub in stubs.rglob("*.pyi"):  # the same required-after-defaulted signature as in tensorrt-stubs
        text = stub.read_text()
        text = text.replace(
            "power: Weights = ..., channel_axis: typing.SupportsInt)",
            "power: Weights = ..., channel_axis: typing.SupportsInt = ...)",
        )
        # IHostMemory implements the buffer protocol (bytes(plan) works); stubgen cannot see that
        text = text.replace(
            "class IHostMemory:", "class IHostMemory:\n    def __buffer__(self, flags: int, /) -> memoryview: ..."
        )
        stub.write_text(text)
    typed_rtx_copy(repo, tmp / "src")
    code, ours, tail = _mypy(RTX_CHECKED, tmp / "src", str(stubs))
    print(
        "\n".join(f"[tensorrt-rtx] {line}" for line in ours)
        or f"mypy: no issues in {', '.join(RTX_CHECKED)} against tensorrt_rtx (typed backend.trt)"
    )
    if code:
        print(tail, file=sys.stderr)  # mypy itself failed
        return code
    return 1 if any(": error:" in line for line in ours) else 0


def main() -> int:
    root = stub_root()
    if root is None:
        print("tensorrt-stubs is not installed: pip install --no-deps tensorrt-stubs", file=sys.stderr)
        return 2
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        for package in ("tensorrt", "tensorrt_bindings"):
            for stub in (root / package).glob("*.pyi"):
                text = re.sub(r"\bin: ", "in_: ", stub.read_text())
                # one signature puts a required parameter after defaulted ones
                text = text.replace(
                    "power: Weights = None, channel_axis: int)", "power: Weights = None, channel_axis: int = 0)"
                )
                target = Path(tmp) / "trt_stubs" / package / stub.name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        code, ours, tail = _mypy(CHECKED, repo, str(Path(tmp) / "trt_stubs"))
        print("\n".join(ours) or f"mypy: no issues in {', '.join(CHECKED)} against tensorrt-stubs")
        if code:
            print(tail, file=sys.stderr)  # mypy itself failed
            return code
        status = 1 if any(": error:" in line for line in ours) else 0
        return max(status, check_rtx(repo, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
