"""Which JetPack line a board runs, read from recorded files: ``hrm_deploy.jetpack``,
``jetson/setup.sh --detect`` (which runs it with the system Python before anything is installed)
and ``doctor``'s Jetson checks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hrm_deploy.doctor import jetson_checks
from hrm_deploy.jetpack import board_versions, detect, read_l4t

ROOT = Path(__file__).resolve().parents[2]
# /etc/nv_tegra_release as JetPack 6.2 (L4T 36.4.3), JetPack 7.0 (Thor, L4T 38.2) and JetPack 5.1 write it
R36 = "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 01:49:37 UTC 2025\n"
R38 = "# R38 (release), REVISION: 2.0, GCID: 41844464, BOARD: generic, EABI: aarch64, DATE: Fri Aug 22 00:55:42 UTC 2025\n"
R35 = "# R35 (release), REVISION: 5.0, GCID: 35550185, BOARD: t186ref, EABI: aarch64, DATE: Tue Feb 20 04:46:31 UTC 2024\n"
STATUS = """Package: nvidia-l4t-core
Status: install ok installed
Version: 36.4.3-20250107174145

Package: nvidia-jetpack
Status: install ok installed
Architecture: arm64
Version: {version}
Description: NVIDIA Jetpack Meta Package
"""
TRT_HEADER = "#define TRT_MAJOR_ENTERPRISE 10\n#define NV_TENSORRT_MAJOR 10\n#define NV_TENSORRT_MINOR 3\n#define NV_TENSORRT_PATCH 0\n"


def board(tmp_path: Path, release: str | None, jetpack: str | None = None, cuda: str | None = None) -> Path:
    """A folder laid out like a board's root with the given recorded files."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "proc/device-tree").mkdir(parents=True)
    (root / "proc/device-tree/model").write_bytes(
        b"NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super\x00"
    )
    if release is not None:
        (root / "etc/nv_tegra_release").write_text(release)
    if jetpack is not None:
        (root / "var/lib/dpkg").mkdir(parents=True)
        (root / "var/lib/dpkg/status").write_text(STATUS.format(version=jetpack))
    if cuda is not None:
        (root / "usr/local/cuda").mkdir(parents=True)
        (root / "usr/local/cuda/version.json").write_text(json.dumps({"cuda": {"name": "CUDA SDK", "version": cuda}}))
        (root / "usr/include/aarch64-linux-gnu").mkdir(parents=True)
        (root / "usr/include/aarch64-linux-gnu/NvInferVersion.h").write_text(TRT_HEADER)
    return root


def test_l4t_release_line_is_read():
    assert read_l4t(R36) == "36.4.3" and read_l4t(R38) == "38.2.0" and read_l4t("garbage") is None


@pytest.mark.parametrize(
    "release,jetpack,extra,python",
    [
        (R36, None, "jetson", "3.10"),
        (R36, "6.2.1+b38", "jetson", "3.10"),
        (R38, None, "jetson7", "3.12"),
        (R36, "7.2.2", "jetson7", "3.12"),  # the package's version wins over a stale release file
        (None, "7.2.2-b1", "jetson7", "3.12"),
    ],
)
def test_the_line_comes_from_the_package_else_the_release_file(tmp_path, release, jetpack, extra, python):
    found = detect(board(tmp_path, release, jetpack))
    assert found is not None and found.line is not None
    assert (found.line.extra, found.line.python) == (extra, python)
    assert found.source.startswith("nvidia-jetpack" if jetpack else "L4T R")


def test_jetpack_5_and_a_desktop_are_told_apart(tmp_path):
    old = detect(board(tmp_path, R35))
    assert old is not None and old.line is None and "JetPack 6" in old.why
    assert detect(tmp_path / "empty") is None


def test_setup_script_says_which_line_it_chose_and_refuses_others(tmp_path):
    script = ROOT / "jetson" / "setup.sh"
    done = subprocess.run(["bash", str(script), "--detect", str(board(tmp_path, R38))], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("jetson7 3.12 JetPack 7 (L4T R38.2.0)"), done
    desktop = subprocess.run(["bash", str(script), "--detect", str(tmp_path / "none")], capture_output=True, text=True)
    assert desktop.returncode == 2 and desktop.stderr.count("\n") == 1 and "not a Jetson" in desktop.stderr


def test_doctor_reports_line_cuda_and_tensorrt_on_a_board(tmp_path):
    root = board(tmp_path, R36, "6.2.1+b38", cuda="12.6.68")
    assert board_versions(root) == {"cuda": "12.6.68", "tensorrt": "10.3.0"}
    jetson, line = jetson_checks(root)
    assert jetson.ok and "Orin Nano" in jetson.detail
    assert line.ok and line.detail.startswith("JetPack 6 (nvidia-jetpack 6.2.1+b38): CUDA 12.6.68, TensorRT 10.3.0")
    assert "'jetson' extra" in line.detail


def test_doctor_flags_cuda_that_is_not_the_lines(tmp_path):
    (_, line) = jetson_checks(board(tmp_path, R38, cuda="12.6.68"))
    assert not line.ok and "CUDA 13" in line.fix
    (_, old) = jetson_checks(board(tmp_path / "b", R35))
    assert not old.ok and "JetPack 6 (L4T R36)" in old.detail


def test_doctor_off_a_jetson(tmp_path):
    assert [(c.name, c.ok) for c in jetson_checks(tmp_path)] == [("jetson", False)]
