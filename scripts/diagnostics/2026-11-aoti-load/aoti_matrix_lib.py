"""The standard-library engine of scripts/aoti_load_matrix.py: the variant table, the child
processes (each in its own process group, up to --jobs at once, --repeat runs each, within a time
budget), their verdicts, the per-variant summary and the mechanical `read:` line.

A child is `python scripts/diagnostics/2026-11-aoti-load/aoti_load_child.py SPEC_JSON`, or the command in $AOTI_MATRIX_CHILD
(the spec JSON appended as its last argument): tests put a fake child there.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHILD = str(Path(__file__).resolve().parent / "aoti_load_child.py")
CHILD_ENV = "AOTI_MATRIX_CHILD"
EST = {"api": 35, "loader": 14, "dlopen": 12, "runner": 14, "warm": 35, "fresh": 50, "run": 25}
CLI_IMPORTS = ["hrm_deploy.cli", "hrm_deploy.verify", "hrm_deploy.backends.reference", "onnxruntime", "onnx"]
SHORT = {
    "ort": "onnxruntime",
    "onnx": "onnx",
    "cli": "hrm_deploy.cli",
    "verify": "hrm_deploy.verify",
    "reference": "hrm_deploy.backends.reference",
}


@dataclass(frozen=True)
class Variant:
    """One load variant: spec overrides, extra environment, cost class (EST key) and, for the read
    line, the variant it adds one thing to (`base`) and what that thing is (`what`)."""

    name: str
    over: dict
    kind: str
    base: str = ""
    what: str = ""
    env: dict = field(default_factory=dict)


def variant_table(work: str) -> list[Variant]:
    """All variants in their default order (the ones earlier GPU runs printed first)."""
    api, runner, loader = {"method": "api"}, {"method": "runner"}, {"method": "loader"}
    v = [
        Variant("tool-api", {**api, "facts": True}, "api"),
        Variant("dlopen-extracted", {"method": "dlopen"}, "dlopen"),
        Variant("runner-extracted", runner, "runner"),
        Variant("hrm-runner", {"method": "hrm-runner"}, "api"),
        Variant("api-cli-imports", {**api, "pre_imports": CLI_IMPORTS}, "api", "tool-api", "importing CLI_IMPORTS"),
        Variant(
            "runner-cli-imports",
            {**runner, "pre_imports": CLI_IMPORTS},
            "runner",
            "runner-extracted",
            "importing CLI_IMPORTS",
        ),
    ]
    extra = {**SHORT, "inductor": "torch._inductor", "dynamo": "torch._dynamo"}
    v += [
        Variant(f"runner-import-{s}", {**runner, "pre_imports": [m]}, "runner", "runner-extracted", f"importing {m}")
        for s, m in extra.items()
    ]
    v.append(
        Variant(
            "runner-cuda-ctx",
            {**runner, "cuda_op": True},
            "runner",
            "runner-extracted",
            "a CUDA kernel run (and synchronised) before the load",
        )
    )
    amx = "AMX tile-data permission (torch.cpu._init_amx(), as onnxruntime's import and torch's compiler ask)"
    v += [
        Variant("runner-amx", {**runner, "amx": True}, "runner", "runner-extracted", amx),
        Variant(
            "runner-amx-first",
            {**runner, "amx_first": True},
            "runner",
            "runner-extracted",
            amx + ", asked before CUDA is initialised",
        ),
        Variant("api-amx", {**api, "amx": True}, "api", "tool-api", amx),
    ]
    v += [
        Variant(f"api-import-{s}", {**api, "pre_imports": [m]}, "api", "tool-api", f"importing {m}")
        for s, m in SHORT.items()
    ]
    v += [
        Variant("tool-loader", loader, "loader"),
        Variant("loader-st0-dev", {**loader, "st": False}, "loader", "tool-loader", "run_single_threaded=False"),
        Variant("loader-st1-devdef", {**loader, "dev": -1}, "loader", "tool-loader", "device_index=-1"),
        Variant("loader-defaults", {**loader, "st": False, "dev": -1}, "loader", "tool-loader", "torch's defaults"),
        Variant("loader-no-cuda-init", {**loader, "cuda": "none"}, "loader", "tool-loader", "no CUDA init before it"),
        Variant("loader-warm", {**loader, "warm": True}, "warm", "tool-loader", "a torch.compile'd CUDA op before it"),
        Variant(
            "api-fresh-cache",
            api,
            "fresh",
            "tool-api",
            "an empty TORCHINDUCTOR_CACHE_DIR",
            {"TORCHINDUCTOR_CACHE_DIR": os.path.join(work, "fresh-cache")},
        ),
    ]
    return v


def say(line: str = "") -> None:
    print(line, flush=True)


def tmp_dirs() -> set[str]:
    try:
        return {
            e.path for e in os.scandir("/tmp") if e.is_dir() and re.fullmatch(r"(aotinductor_)?[A-Za-z0-9]{6}", e.name)
        }
    except OSError:
        return set()


def leftovers(before: set[str], keep: bool) -> str:
    notes = []
    for d in sorted(tmp_dirs() - before):
        files = [p for p in Path(d).rglob("*") if p.is_file()]
        if not any("aotinductor" in str(p) for p in files):
            continue
        so = [p for p in files if p.suffix == ".so"]
        notes.append(f"{d}: {len(files)} files extracted" + (f", .so {so[0].stat().st_size} B" if so else ", no .so"))
        if not keep:
            shutil.rmtree(d, ignore_errors=True)
    return "; ".join(notes)


def child_argv(spec: dict, wrap: list | None = None) -> list[str]:
    cmd = shlex.split(os.environ.get(CHILD_ENV, "")) or [sys.executable, CHILD]
    return [*(wrap or []), *cmd, json.dumps(spec)]


class Child:
    """One child process in its own process group; stdout/stderr go to files (no pipe can fill up
    while other children run)."""

    def __init__(self, spec: dict, logs: Path, timeout: float, env_extra: dict | None = None, wrap=None):
        env = {**os.environ, "PYTHONFAULTHANDLER": "1", "PYTHONUNBUFFERED": "1", **(env_extra or {})}
        fd, path = tempfile.mkstemp(prefix=f"{spec.get('name', 'child')}-", dir=logs)
        os.close(fd)
        self.out_path, self.err_path = Path(path + ".out"), Path(path + ".err")
        self.start, self.limit = time.perf_counter(), timeout
        self.rc: int | None = None
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen(
                child_argv(spec, wrap),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def secs(self) -> float:
        return time.perf_counter() - self.start

    def done(self) -> bool:
        """True once the child has exited or been killed at its time limit (rc None)."""
        if self.proc.poll() is None and self.secs() < self.limit:
            return False
        self.rc = self.proc.returncode
        self.kill()  # its leftovers (compile workers) too; the whole group after a time-out
        return True

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()

    def texts(self) -> tuple[str, str]:
        read = lambda p: p.read_text(errors="replace") if p.is_file() else ""  # noqa: E731
        return read(self.out_path), read(self.err_path)


def run_child(spec: dict, timeout: float, logs: Path, env_extra: dict | None = None, wrap: list | None = None):
    """One child to its end: (rc or None at the time limit, stdout, stderr, seconds)."""
    c = Child(spec, logs, timeout, env_extra, wrap)
    while not c.done():
        time.sleep(0.05)
    return (c.rc, *c.texts(), c.secs())


def verdict(rc, out: str, err: str) -> tuple[str, str]:
    steps = re.findall(r"^STEP (\S+)", out, re.M)
    last = steps[-1] if steps else "-"
    if rc is None:
        return "timeout", last
    if rc < 0:
        try:
            return signal.Signals(-rc).name, last
        except ValueError:
            return f"signal {-rc}", last
    if rc == 0 and "RESULT ok" in out:
        return "ok", last
    m = re.search(r"^ERROR (.+)$", out, re.M)
    if m:
        return "error " + m.group(1), last
    tail = (err.strip().splitlines() or [f"rc {rc}"])[-1][:200]
    return f"error rc={rc}: {tail}", last


@dataclass
class Outcome:
    res: str
    last: str
    secs: float
    out: str = ""


def state(runs: list[Outcome]) -> str:
    """ok (every run), dies (every run by a signal), flaky (both), other (errors, time-outs), '' (none ran)."""
    kinds = {"ok" if r.res == "ok" else "dies" if r.res.startswith(("SIG", "signal")) else "other" for r in runs}
    if not kinds or len(kinds) == 1:
        return next(iter(kinds), "")
    return "flaky" if kinds == {"ok", "dies"} else "other"


def summary(runs: list[Outcome], skipped: int, left_at_skip: float) -> str:
    if not runs:
        return f"skipped (budget: {left_at_skip:.0f} s left)"
    if len(runs) == 1 and not skipped:
        return f"{runs[0].res} ({runs[0].secs:.1f} s, last step {runs[0].last})"
    counts = Counter(r.res for r in runs)
    order = sorted(counts, key=lambda r: (r != "ok", -counts[r], r))
    lasts = list(dict.fromkeys(r.last for r in runs))
    text = ", ".join(f"{r} {counts[r]}/{len(runs)}" for r in order)
    text += f" ({'/'.join(f'{r.secs:.1f}' for r in runs)} s, last step {'/'.join(lasts)})"
    return text + (f"; {skipped} of {len(runs) + skipped} runs skipped (budget)" if skipped else "")


def run_matrix(
    todo: list[tuple[Variant, dict]], jobs: int, repeat: int, left, timeout: float, logs: Path, keep: bool, line
) -> dict[str, list[Outcome]]:
    """Run every (variant, spec) `repeat` times, up to `jobs` at once; a run that cannot start
    before the budget ends is skipped. `line(variant, spec, runs, skipped, left, note)` prints one
    variant once all its runs ended, in `todo` order. Returns the outcomes by variant name.

    Runs start round by round (every variant once, then again), so a short budget still sees each
    variant. The /tmp extraction folders are attributed per run only with jobs == 1."""
    pending = [(k, i) for k in range(repeat) for i in range(len(todo))]
    runs: dict[str, list[Outcome]] = {v.name: [] for v, _ in todo}
    skipped: Counter[str] = Counter()
    left_at: dict[str, Any] = {}
    notes: dict[str, list[str]] = {v.name: [] for v, _ in todo}
    running: list[tuple[int, Child, set]] = []
    printed, leaked, before_all = 0, 0, tmp_dirs()
    try:
        while pending or running:
            while pending and len(running) < jobs:
                k, i = pending.pop(0)
                v, spec = todo[i]
                if left() < EST[v.kind]:
                    skipped[v.name] += 1
                    left_at.setdefault(v.name, left())
                    continue
                spec = {**spec, "name": v.name, "attempt": k}
                running.append((i, Child(spec, logs, min(timeout, max(left(), 5)), v.env), tmp_dirs()))
            time.sleep(0.05)
            for item in [r for r in running if r[1].done()]:
                running.remove(item)
                i, c, before = item
                out, err = c.texts()
                res, last = verdict(c.rc, out, err)
                runs[todo[i][0].name].append(Outcome(res, last, c.secs(), out))
                note = leftovers(before, keep) if jobs == 1 else ""
                if note and res == "ok":
                    leaked += 1  # the loader's destructor did not run at interpreter exit
                elif note:
                    notes[todo[i][0].name].append(note)
            while printed < len(todo) and len(runs[todo[printed][0].name]) + skipped[todo[printed][0].name] == repeat:
                v, spec = todo[printed]
                line(v, spec, runs[v.name], skipped[v.name], left_at.get(v.name, 0.0), "; ".join(notes[v.name]))
                printed += 1
    finally:
        for _, c, _ in running:
            c.kill()
    if jobs > 1:
        note = leftovers(before_all, keep)
        if note:
            say(f"left in /tmp by the children (not attributed with --jobs > 1): {note}")
    if leaked:
        say(f"note: {leaked} child(ren) that loaded fine left their /tmp extraction folder behind at exit")
    return runs


def read_line(st: dict[str, str], runs: dict[str, list[Outcome]], table: list[Variant]) -> str:
    """The conclusion the results allow, mechanically: each variant against its base."""
    says = []
    flaky = [f"{n} ({sum(r.res == 'ok' for r in runs[n])}/{len(runs[n])} ok)" for n, s in st.items() if s == "flaky"]
    if flaky:
        says.append(
            f"{', '.join(flaky)} both crashed and loaded => the crash is non-deterministic (compare "
            "variants only over several --repeat runs)"
        )
    for base in ("runner-extracted", "tool-api", "tool-loader"):
        fam = [v for v in table if v.base == base and st.get(v.name)]
        if st.get(base) == "dies" and fam:
            helped = [v for v in fam if st[v.name] == "ok"]
            if len(helped) == len(fam) >= 3:  # runner-import-dynamo as much as onnxruntime: no one culprit
                says.append(
                    f"{base} dies alone but loads after every one of the {len(fam)} additions tried "
                    f"({', '.join(v.name for v in fam)}) => not one module's doing: the process state in general "
                    "(timing, heap layout, something any import initialises)"
                )
            elif helped:
                names = [f"{v.what} ({v.name})" for v in helped] if len(helped) <= 3 else [v.name for v in helped]
                says.append(
                    f"{base} dies alone but loads after {', '.join(names)}"
                    f" => {'that avoids' if len(helped) == 1 else 'each of these avoids'} the crash"
                )
                singles = [
                    v
                    for v in fam
                    if v.over.get("pre_imports", [""])[0] in CLI_IMPORTS and len(v.over["pre_imports"]) == 1
                ]
                if (
                    singles
                    and all(st[v.name] == "dies" for v in singles)
                    and any(v in helped for v in fam if "cli-imports" in v.name)
                ):
                    says.append(f"no single CLI import saves {base}: it takes their combination")
            elif all(st[v.name] == "dies" for v in fam):
                says.append(
                    f"{base} dies, and so do all {len(fam)} variants of it that ran => none of those "
                    "changes avoids the crash"
                )
        elif st.get(base) == "ok":
            hurt = [v for v in fam if st[v.name] == "dies"]
            if hurt:
                says.append(
                    f"{base} loads but dies after {', '.join(f'{v.what} ({v.name})' for v in hurt)} => "
                    "that causes the crash"
                )
    dl, rx = st.get("dlopen-extracted"), st.get("runner-extracted")
    if dl == "dies":
        says.append("dlopen-extracted dies => linking/static initialisers of the .so (see elf NEEDED/RPATH)")
    elif dl == "ok" and rx == "dies":
        says.append(
            "dlopen-extracted ok but runner-extracted dies => model container creation (weights/CUDA), not linking"
        )
    if rx == "ok" and "dies" in (st.get("tool-api"), st.get("tool-loader")):
        says.append("runner-extracted loads but the package loader dies => zip extraction/metadata, not the .so")
    if st.get("control-fresh") == "dies":
        says.append("control-fresh dies too => not this package (torch/driver/host)")
    if not says and st and all(s == "ok" for s in st.values()):
        most = max((len(r) for r in runs.values()), default=1)
        says.append(
            "every variant that ran loaded => the crash did not reproduce here"
            + (" (try --repeat)" if most == 1 else f" (up to {most} runs each)")
        )
    return "read: " + ("; ".join(says) if says else "no decisive contrast among the variants that ran")


# The variants that decide the cause of the fresh-process crash (docs/gpu.md): container creation
# alone (control), the AMX permission asked before / after CUDA initialisation, onnxruntime's import
# first; with --ort-libs also each library that import maps, preloaded alone.
CAUSE_VARIANTS = ["runner-extracted", "runner-amx-first", "runner-amx", "runner-import-ort"]
FAULT_REPORT_C = Path(__file__).with_name("fault_report.c")
PRELOAD_PREFIX = "runner-preload-"
ORT_MAPS_CODE = """
import torch
def maps():
    names = (line.split()[-1] for line in open('/proc/self/maps') if len(line.split()) >= 6)
    return {n for n in names if n.startswith('/') and ('.so' in n.rsplit('/', 1)[-1])}
before = maps()
import onnxruntime
print('\\n'.join(sorted(maps() - before)))
"""


def build_fault_report(work: Path) -> str | None:
    """fault_report.c compiled with this machine's C compiler into ``work`` (its path), or None
    (said why) where there is no compiler or the compile fails."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        say("fault report: no C compiler (cc) here; crashed children print no faulting library")
        return None
    out = work / "fault_report.so"
    cmd = [cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(FAULT_REPORT_C), "-ldl"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        say(f"fault report: the compile failed: {done.stderr.strip()[-300:]}")
        return None
    return str(out)


def fault_env(library: str) -> dict:
    """The children's environment additions for the fault report: it preloaded, and Python's own
    fault handler off (it would catch the signal first and re-raise it from elsewhere)."""
    preload = " ".join(p for p in (library, os.environ.get("LD_PRELOAD", "")) if p)
    return {"LD_PRELOAD": preload, "PYTHONFAULTHANDLER": ""}


def ort_mapped_libraries(timeout: float = 120.0) -> list[str]:
    """The shared libraries ``import onnxruntime`` maps into a process that has imported torch
    (a ``/proc/self/maps`` diff in a child); [] where the child fails (no onnxruntime)."""
    try:
        done = subprocess.run([sys.executable, "-c", ORT_MAPS_CODE], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return []
    if done.returncode != 0:
        say(f"--ort-libs: the maps diff failed: {(done.stderr.strip().splitlines() or ['?'])[-1][:200]}")
        return []
    return [line for line in done.stdout.splitlines() if line.startswith("/")]


def preload_variants(libraries: list[str]) -> list[Variant]:
    """runner-extracted after one library of ``libraries`` was loaded RTLD_GLOBAL, per library."""
    out = []
    for path in libraries:
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(path).split(".so")[0])
        what = f"preloading {os.path.basename(path)} (RTLD_GLOBAL; mapped by onnxruntime's import)"
        out.append(
            Variant(PRELOAD_PREFIX + stem, {"method": "runner", "preload": [path]}, "runner", "runner-extracted", what)
        )
    return out
