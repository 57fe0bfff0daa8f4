"""JetPack lines: which one a Jetson runs, and what each pins.

Two lines are supported (``docs/jetson.md``):

- **JetPack 6** (L4T R36, Ubuntu 22.04, Python 3.10, CUDA 12.6, TensorRT 10.3): the ``jetson`` extra,
  ``cuda-python`` 12.x;
- **JetPack 7** (L4T R38 and later, Ubuntu 24.04, Python 3.12, CUDA 13; TensorRT 10.x on 7.0/7.1
  (Thor), 11.4.1 from 7.2.2 on AGX Orin and Thor): the ``jetson7`` extra, ``cuda-python`` 13.x.

Both keep ``numpy < 2``: JetPack's TensorRT bindings are built against the system's numpy 1.x.

The line is read from the ``nvidia-jetpack`` package's version (dpkg's status file) when it is
installed, else from ``/etc/nv_tegra_release`` (``# R36 (release), REVISION: 4.3, ...``). Standard
library only: ``jetson/setup.sh`` runs this file with the system ``python3`` before anything is
installed (``python3 hrm_deploy/jetpack.py`` prints the line and the extra to install).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class JetPackLine:
    """One JetPack generation and what hrm-deploy installs on it."""

    name: str  # "JetPack 6"
    major: int  # JetPack's major version
    l4t: tuple[int, ...]  # the L4T releases (R36 -> 36) of this line
    extra: str  # the pip extra that installs the runtime's dependencies on it
    python: str  # the system Python the venv is made from
    cuda: str
    tensorrt: str
    ubuntu: str
    glibc: tuple[int, int]  # the Ubuntu release's glibc: the newest manylinux tag its wheels may carry


LINES: tuple[JetPackLine, ...] = (
    JetPackLine("JetPack 6", 6, (36,), "jetson", "3.10", "12.6", "10.3", "22.04", (2, 35)),
    JetPackLine(
        "JetPack 7", 7, (38, 39, 40), "jetson7", "3.12", "13", "10.x (7.0/7.1) or 11.4.1 (7.2.2+)", "24.04", (2, 39)
    ),
)


def platform_tags(line: JetPackLine) -> list[str]:
    """The wheel platform tags pip accepts on the line's boards, newest first: every
    ``manylinux_2_X_aarch64`` up to its glibc, and ``manylinux2014_aarch64`` (pip's ``--platform``
    does not widen one tag to the older ones, so each is named)."""
    major, newest = line.glibc
    return [f"manylinux_{major}_{x}_aarch64" for x in range(newest, 16, -1)] + ["manylinux2014_aarch64"]


TEGRA_RELEASE = Path("/etc/nv_tegra_release")
DPKG_STATUS = Path("/var/lib/dpkg/status")
CUDA_VERSION = Path("/usr/local/cuda/version.json")
TRT_VERSION_HEADER = Path("/usr/include/aarch64-linux-gnu/NvInferVersion.h")


@dataclass(frozen=True)
class Detected:
    """What a board runs: its line (None: not one hrm-deploy supports), how it was told, the versions read."""

    line: JetPackLine | None
    source: str  # "nvidia-jetpack 6.2.1+b38" or "L4T R36.4.3"
    l4t: str | None = None  # "36.4.3"
    jetpack: str | None = None  # the nvidia-jetpack package version
    why: str = ""  # for an unsupported or unknown line: what to do

    def describe(self) -> str:
        if self.line is None:
            return f"{self.source}: {self.why}"
        return (
            f"{self.line.name} ({self.source}; CUDA {self.line.cuda}, TensorRT {self.line.tensorrt}, "
            f"Python {self.line.python}): extra '{self.line.extra}'"
        )


def read_l4t(text: str) -> str | None:
    """``# R36 (release), REVISION: 4.3, GCID: ...`` -> ``"36.4.3"``; None when the text is not such a line."""
    found = re.search(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([0-9.]+)", text)
    return f"{found.group(1)}.{found.group(2)}" if found else None


def package_version(status: str, package: str) -> str | None:
    """The installed version of ``package`` in dpkg's status file text (None: not installed)."""
    for stanza in status.split("\n\n"):
        fields = dict(
            (key.strip(), value.strip()) for key, _, value in (ln.partition(":") for ln in stanza.splitlines()) if value
        )
        if fields.get("Package") == package and "installed" in fields.get("Status", "installed"):
            return fields.get("Version")
    return None


def line_of(major: int | None = None, l4t: int | None = None) -> JetPackLine | None:
    """The supported line of JetPack major ``major``, or of L4T release ``l4t``."""
    for line in LINES:
        if (major is not None and line.major == major) or (l4t is not None and l4t in line.l4t):
            return line
    return None


def detect(root: Path = Path("/")) -> Detected | None:
    """The board's JetPack line from the files under ``root`` (tests pass a folder of recorded files);
    None when this is not a Jetson (no ``nv_tegra_release``)."""
    release_file, status_file = root / TEGRA_RELEASE.relative_to("/"), root / DPKG_STATUS.relative_to("/")
    status = status_file.read_text(errors="replace") if status_file.is_file() else ""
    jetpack = package_version(status, "nvidia-jetpack")
    if not release_file.is_file() and jetpack is None:
        return None
    l4t = read_l4t(release_file.read_text(errors="replace")) if release_file.is_file() else None
    if jetpack is not None:
        lead = re.match(r"\d+", jetpack)
        source, line = f"nvidia-jetpack {jetpack}", line_of(major=int(lead.group(0)) if lead else None)
    elif l4t is not None:
        source, line = f"L4T R{l4t}", line_of(l4t=int(l4t.split(".")[0]))
    else:
        return Detected(None, "unreadable /etc/nv_tegra_release", why="cannot tell the JetPack release")
    why = (
        "" if line is not None else "hrm-deploy supports JetPack 6 (L4T R36) and JetPack 7 (L4T R38+); upgrade JetPack"
    )
    return Detected(line, source, l4t, jetpack, why)


def board_versions(root: Path = Path("/")) -> dict[str, str]:
    """CUDA and TensorRT versions installed on a board, read from files (no import, no GPU): CUDA's
    ``version.json``, TensorRT's ``NvInferVersion.h``; missing ones are absent from the dict."""
    found: dict[str, str] = {}
    cuda = root / CUDA_VERSION.relative_to("/")
    if cuda.is_file():
        try:
            found["cuda"] = str(json.loads(cuda.read_text())["cuda"]["version"])
        except (ValueError, KeyError, TypeError):
            pass
    header = root / TRT_VERSION_HEADER.relative_to("/")
    if header.is_file():
        text = header.read_text(errors="replace")
        parts = [re.search(rf"#define\s+(?:NV_)?TENSORRT_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
        if all(parts):
            found["tensorrt"] = ".".join(p.group(1) for p in parts if p)
    return found


def main(argv: list[str]) -> int:
    """``python3 hrm_deploy/jetpack.py [ROOT]``: print ``<extra> <python>`` of this board's line, or one
    line on stderr and exit 2 (not a Jetson, or a line hrm-deploy does not support)."""
    found = detect(Path(argv[1]) if len(argv) > 1 else Path("/"))
    if found is None:
        print("error: this is not a Jetson (no /etc/nv_tegra_release); build engines on your desktop", file=sys.stderr)
        return 2
    if found.line is None:
        print(f"error: {found.describe()}", file=sys.stderr)
        return 2
    print(f"{found.line.extra} {found.line.python} {found.line.name} ({found.source})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
