"""scripts/diagnostics/2026-11-aoti-load/aoti_load_matrix.py without a GPU: its children replaced by a fake (tests/scripts/
fake_aoti_child.py) that loads ok, segfaults, errs, hangs or waits for its siblings as told, so the
parent's scheduling (parallel jobs, repeats, the budget, time-outs), its --only check, its output
order and its `read:` line are tested; the real child needs a CUDA package."""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("fake_aoti_child.py")
MATRIX = ROOT / "scripts/diagnostics/2026-11-aoti-load"  # the one-off load-crash harness


@pytest.fixture
def matrix(monkeypatch, tmp_path, capsys):
    """run(plan, *args) -> (exit code, output lines, log folder) for a fake CUDA package."""
    monkeypatch.syspath_prepend(str(MATRIX))
    module = importlib.import_module("aoti_load_matrix")
    pkg = tmp_path / "model.pt2"
    with zipfile.ZipFile(pkg, "w") as z:  # the layout inspect_package unzips; the .so is never loaded
        z.writestr("model/data/aotinductor/model/abc.so", b"\x7fELF not really")
        z.writestr("model/data/aotinductor/model/abc_wrapper_metadata.json", json.dumps({"AOTI_DEVICE_KEY": "cuda"}))
    log = tmp_path / "log"
    log.mkdir()
    monkeypatch.setenv("AOTI_MATRIX_CHILD", f"{shlex.quote(sys.executable)} {shlex.quote(str(FAKE))}")
    monkeypatch.setenv("FAKE_AOTI_LOG", str(log))

    def run(plan: dict, *args: str, forensics: bool = False):
        monkeypatch.setenv("FAKE_AOTI_PLAN", json.dumps(plan))
        capsys.readouterr()
        rc = module.main([str(pkg), *args] + ([] if forensics else ["--no-forensics"]))
        return rc, capsys.readouterr().out.splitlines(), log

    run.module = module
    return run


def _line(lines: list[str], name: str) -> str:
    return next(ln for ln in lines if ln.startswith(name + " "))


def _read(lines: list[str]) -> str:
    return next(ln for ln in lines if ln.startswith("read: "))


def test_an_unknown_only_name_is_one_line_listing_the_names(matrix):
    rc, lines, _ = matrix({}, "--only", "runner-extracted,runner-import-bogus")
    assert rc == 2 and len(lines) == 1
    assert "runner-import-bogus" in lines[0] and "runner-import-ort" in lines[0] and "runner-cuda-ctx" in lines[0]
    rc, lines, _ = matrix({}, "--jobs", "0")
    assert rc == 2 and len(lines) == 1 and "--jobs 0" in lines[0]


@pytest.mark.slow
def test_jobs_run_at_once_and_print_in_variant_order(matrix):
    # each waits until all three have started: run one at a time, the first would give up (an error)
    plan = {"dlopen-extracted": "barrier:3+sleep:0.5", "runner-extracted": "barrier:3+segv"}
    plan["runner-import-ort"] = "barrier:3"
    rc, lines, _ = matrix(plan, "--jobs", "3", "--only", "runner-import-ort,dlopen-extracted,runner-extracted")
    assert rc == 0
    names = [ln.split()[0] for ln in lines if ln.startswith(("dlopen-", "runner-"))]
    assert names == ["dlopen-extracted", "runner-extracted", "runner-import-ort"]  # the table's order
    assert "ok (" in _line(lines, "dlopen-extracted") and "last step loaded" in _line(lines, "dlopen-extracted")
    assert " SIGSEGV (" in _line(lines, "runner-extracted") and "last step load)" in _line(lines, "runner-extracted")
    assert " ok (" in _line(lines, "runner-import-ort")
    read = _read(lines)
    assert "runner-extracted dies alone but loads after importing onnxruntime (runner-import-ort)" in read
    assert "dlopen-extracted ok but runner-extracted dies => model container creation" in read


@pytest.mark.slow
def test_no_more_than_jobs_children_at_once(matrix):
    names = ["dlopen-extracted", "runner-extracted", "runner-import-ort", "runner-import-onnx"]
    _, lines, log = matrix(dict.fromkeys(names, "sleep:0.3"), "--jobs", "2", "--only", ",".join(names))
    spans = [json.loads((log / f"{n}-0.json").read_text()) for n in names]
    most = max(sum(s["start"] <= t < s["end"] for s in spans) for t in (s["start"] for s in spans))
    assert most <= 2
    assert all(" ok (" in _line(lines, n) for n in names)


def test_repeats_count_each_outcome_and_a_mixed_one_reads_non_deterministic(matrix):
    plan = {"runner-extracted": "segv,ok", "runner-import-ort": "ok"}
    rc, lines, log = matrix(plan, "--repeat", "3", "--jobs", "3", "--only", "runner-extracted,runner-import-ort")
    assert rc == 0
    line = _line(lines, "runner-extracted")
    assert "ok 2/3, SIGSEGV 1/3 (" in line and line.count("/") >= 4  # three durations
    assert "ok 3/3 (" in _line(lines, "runner-import-ort")
    assert len(list(log.glob("runner-extracted-*.json"))) == 3
    read = _read(lines)
    assert "runner-extracted (2/3 ok) both crashed and loaded => the crash is non-deterministic" in read
    assert "avoids" not in read  # no import can be credited while the base itself is flaky


@pytest.mark.slow
def test_a_run_that_cannot_start_before_the_budget_ends_is_skipped(matrix):
    # runner variants are estimated at 14 s, API loads at 35 s: with 20 s only the runner starts
    _, lines, log = matrix({}, "--budget", "20", "--only", "tool-api,runner-extracted")
    assert "skipped (budget: 20 s left)" in _line(lines, "tool-api")
    assert " ok (" in _line(lines, "runner-extracted") and not (log / "tool-api-0.json").exists()
    # the budget runs out while the first run works: its second run and the next variant never start
    plan = {"runner-extracted": "sleep:1.0"}
    _, lines, log = matrix(plan, "--budget", "14.8", "--repeat", "2", "--only", "runner-extracted,runner-import-ort")
    line = _line(lines, "runner-extracted")
    assert "ok 1/1 (" in line and line.endswith("; 1 of 2 runs skipped (budget)")
    assert "skipped (budget: 1" in _line(lines, "runner-import-ort")
    assert not (log / "runner-import-ort-0.json").exists() and not (log / "runner-extracted-1.json").exists()


@pytest.mark.slow
def test_a_child_past_its_time_limit_is_killed_with_its_group(matrix):
    _, lines, log = matrix({"runner-extracted": "hang"}, "--timeout", "1", "--only", "runner-extracted")
    assert " timeout (1." in _line(lines, "runner-extracted") and "last step load)" in _line(lines, "runner-extracted")
    pid = json.loads((log / "runner-extracted-0.json").read_text())["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_fast_first_runs_the_cheap_variants_first(matrix):
    _, lines, log = matrix({}, "--fast-first", "--only", "tool-api,runner-extracted,dlopen-extracted,hrm-runner")
    names = [ln.split()[0] for ln in lines if ln.startswith(("tool-", "dlopen-", "runner-", "hrm-"))]
    assert names == ["dlopen-extracted", "runner-extracted", "tool-api", "hrm-runner"]
    starts = {n: json.loads((log / f"{n}-0.json").read_text())["start"] for n in names}
    assert sorted(starts, key=starts.get) == names
    assert _read(lines).endswith("every variant that ran loaded => the crash did not reproduce here (try --repeat)")


def test_the_read_line_compares_each_variant_with_its_base(matrix):
    lib = importlib.import_module("aoti_matrix_lib")
    table = lib.variant_table("/w")
    singles = [f"runner-import-{s}" for s in lib.SHORT]
    st = {"runner-extracted": "dies", "runner-cli-imports": "ok", **dict.fromkeys(singles, "dies")}
    read = lib.read_line(st, {}, table)
    assert "runner-extracted dies alone but loads after importing CLI_IMPORTS (runner-cli-imports)" in read
    assert "no single CLI import saves runner-extracted: it takes their combination" in read
    st = {"tool-api": "ok", "api-import-onnx": "dies", "runner-extracted": "dies", "runner-cuda-ctx": "dies"}
    read = lib.read_line(st, {}, table)
    assert "tool-api loads but dies after importing onnx (api-import-onnx) => that causes the crash" in read
    assert "runner-extracted dies, and so do all 1 variants of it that ran" in read
    assert lib.read_line({"runner-extracted": "other"}, {}, table) == (
        "read: no decisive contrast among the variants that ran"
    )
    assert "control-fresh dies too => not this package" in lib.read_line({"control-fresh": "dies"}, {}, table)
    family = [v.name for v in table if v.base == "runner-extracted"]
    read = lib.read_line({"runner-extracted": "dies", **dict.fromkeys(family, "ok")}, {}, table)
    assert f"loads after every one of the {len(family)} additions tried" in read and "not one module's doing" in read


def test_a_crash_is_rerun_with_the_loader_trace_while_time_is_left(matrix):
    # 25 s: the LD_DEBUG rerun (20 s) fits, the gdb one (30 s) does not
    _, lines, log = matrix({"runner-extracted": "segv"}, "--budget", "25", "--only", "runner-extracted", forensics=True)
    assert any(ln.startswith("LD_DEBUG=files rerun of runner-extracted") for ln in lines)
    assert (log / "runner-extracted-0.json").exists() and not any("gdb rerun" in ln for ln in lines)


@pytest.mark.slow
def test_the_real_child_imports_what_it_is_told_and_reports_each_step(tmp_path):
    """The real child (torch imported, no GPU): a pre-import, then dlopen of a system library."""
    spec = {
        "device": "cpu",
        "index": 0,
        "st": True,
        "dev": -1,
        "cuda": "tool",
        "method": "dlopen",
        "so": "libm.so.6",
        "pre_imports": ["json", "no_such_module_here"],
    }
    out = subprocess.run(
        [sys.executable, str(MATRIX / "aoti_load_child.py"), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert re.findall(r"^STEP (\S+)", out, re.M) == [
        "import",
        "import-json",
        "import-no_such_module_here",
        "load",
        "loaded",
    ]
    assert "FACT pre-import no_such_module_here unavailable" in out and out.rstrip().endswith("RESULT ok")
    spec = {**spec, "method": "runner", "so": str(tmp_path / "missing.so"), "pre_imports": []}
    done = subprocess.run(
        [sys.executable, str(MATRIX / "aoti_load_child.py"), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 3 and re.search(r"^ERROR \w+: ", done.stdout, re.M)
