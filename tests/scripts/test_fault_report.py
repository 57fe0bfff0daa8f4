"""The load-crash harness's cause variants and fault report without a GPU: the variant list, the
children's fault report (compiled here with cc) on a planted crashing library, and `--cause` with
`--fault-report` through the matrix with a fake child."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts.test_aoti_load_matrix import MATRIX, _line, matrix  # noqa: F401

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc)")


@pytest.fixture
def lib(monkeypatch):
    monkeypatch.syspath_prepend(str(MATRIX))
    return importlib.import_module("aoti_matrix_lib")


def test_the_cause_variants_each_add_one_thing_to_the_control(lib):
    table = {v.name: v for v in lib.variant_table("")}
    assert lib.CAUSE_VARIANTS == ["runner-extracted", "runner-amx-first", "runner-amx", "runner-import-ort"]
    assert all(name in table for name in lib.CAUSE_VARIANTS)
    assert all(table[n].base == "runner-extracted" for n in lib.CAUSE_VARIANTS[1:])
    assert table["runner-amx-first"].over["amx_first"] and "before CUDA" in table["runner-amx-first"].what
    extra = lib.preload_variants(["/opt/x/libonnxruntime.so.1.20.1", "/usr/lib/libgomp-a34b3233.so.1"])
    assert [v.name for v in extra] == ["runner-preload-libonnxruntime", "runner-preload-libgomp-a34b3233"]
    assert extra[1].over == {"method": "runner", "preload": ["/usr/lib/libgomp-a34b3233.so.1"]}
    assert extra[0].base == "runner-extracted" and "RTLD_GLOBAL" in extra[0].what


@pytest.mark.slow
def test_the_maps_diff_lists_the_libraries_onnxruntime_maps(lib):
    pytest.importorskip("onnxruntime")
    libraries = lib.ort_mapped_libraries()
    assert libraries and any("onnxruntime" in Path(p).name for p in libraries)
    assert not any("libtorch" in Path(p).name for p in libraries)  # torch's were mapped before


def _crashing_library(folder: Path) -> Path:
    source = folder / "crash.c"
    source.write_text(
        "static void crash_here(void) { *(volatile int *)0 = 1; }\n"
        "__attribute__((constructor)) static void boom(void) { crash_here(); }\n"
    )
    out = folder / "crash.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O0", "-o", str(out), str(source)], check=True)
    return out


@needs_cc
def test_the_fault_report_names_the_faulting_library_and_offset_and_the_child_still_dies(lib, tmp_path):
    report = lib.build_fault_report(tmp_path)
    crash = _crashing_library(tmp_path)
    env = {"PATH": "/usr/bin:/bin", **lib.fault_env(report)}
    done = subprocess.run(
        [sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(crash)!r})"], capture_output=True, text=True, env=env
    )
    assert done.returncode == -11, done.stderr  # SIGSEGV, as without the report
    first = re.search(r"^FAULT Segmentation fault at pc 0x[0-9a-f]+ in (\S+)\+0x([0-9a-f]+)", done.stderr, re.M)
    assert first and first.group(1) == str(crash), done.stderr
    assert "FAULT backtrace:" in done.stderr and f"{crash}(+0x{first.group(2)})" in done.stderr
    assert env["PYTHONFAULTHANDLER"] == ""  # Python's handler would catch it first


def test_cause_with_the_fault_report_runs_the_cause_variants_preloaded(matrix, monkeypatch):  # noqa: F811
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc)")
    monkeypatch.setenv("FAKE_AOTI_ECHO_ENV", "1")
    plan = {"runner-extracted": "segv", "runner-amx-first": "ok", "runner-amx": "segv", "runner-import-ort": "ok"}
    rc, lines, log = matrix(plan, "--cause", "--fault-report")
    assert rc == 0
    assert any(ln.startswith("fault report: ") and "fault_report.so preloaded" in ln for ln in lines)
    ran = [ln.split()[0] for ln in lines if ln.startswith("runner-")]
    assert ran == ["runner-extracted", "runner-import-ort", "runner-amx", "runner-amx-first"]  # the table order
    assert " SIGSEGV (" in _line(lines, "runner-amx") and " ok (" in _line(lines, "runner-amx-first")
    seen = json.loads((log / "env-runner-amx-first-0.json").read_text())
    assert seen["LD_PRELOAD"].split()[0].endswith("fault_report.so") and seen["PYTHONFAULTHANDLER"] == ""
    assert seen["fault_report"] is True
