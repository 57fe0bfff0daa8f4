"""Type-check the TensorRT code path (``hrm_deploy.engines``) with mypy against the
``tensorrt-stubs`` package (TensorRT 10.x API, the Jetson JetPack 6 generation).

The stubs ship without a py.typed marker under ``tensorrt/`` and have a few signatures mypy cannot parse
(the keyword ``in`` as a parameter name, a required parameter after defaulted ones). This copies them into a
temporary stub folder with those names fixed and points mypy at it.

    python scripts/typecheck_tensorrt.py      # exit status = mypy's
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CHECKED = ["hrm_deploy/engines", "hrm_deploy/runners/trt.py", "hrm_deploy/runners/adapter.py",
           "hrm_deploy/runners/device_loop.py", "hrm_deploy/runners/memory.py"]


def stub_root() -> Path | None:
    spec = importlib.util.find_spec("tensorrt_stubs")
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent.parent


def main() -> int:
    root = stub_root()
    if root is None:
        print("tensorrt-stubs is not installed: pip install --no-deps tensorrt-stubs", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        for package in ("tensorrt", "tensorrt_bindings"):
            for stub in (root / package).glob("*.pyi"):
                text = re.sub(r"\bin: ", "in_: ", stub.read_text())
                # one signature puts a required parameter after defaulted ones
                text = text.replace("power: Weights = None, channel_axis: int)", "power: Weights = None, channel_axis: int = 0)")
                target = Path(tmp) / package / stub.name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
        env = {**os.environ, "MYPYPATH": tmp}
        repo = Path(__file__).resolve().parents[1]
        cmd = [sys.executable, "-m", "mypy", "--follow-imports=silent", "--no-incremental", *CHECKED]
        run = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    # mypy also reports the stubs' own inconsistencies (pybind11-generated); only ours count.
    ours = [line for line in run.stdout.splitlines() if line.startswith("hrm_deploy/")]
    print("\n".join(ours) or f"mypy: no issues in {', '.join(CHECKED)} against tensorrt-stubs")
    if "error:" not in run.stdout and run.returncode != 0:
        print(run.stdout[-2000:] + run.stderr[-2000:], file=sys.stderr)  # mypy itself failed
        return run.returncode
    return 1 if any(": error:" in line for line in ours) else 0


if __name__ == "__main__":
    sys.exit(main())
