"""What the GPU check scripts share (scripts/device_check.py, scripts/device_check_bundled.py):
stages as child processes with time limits, background stages, the budget, and the summary
(``device_check*.json`` / ``.md``) rewritten after every stage, so a run cut short keeps what it
learned. Standard library only (the scripts import torch themselves)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable
HRM = [PY, "-m", "hrm_deploy"]
BUNDLED = "hrm_deploy/train/presets/sudoku-small.pt"
PUZZLE = "175604839462893157893751642930517264624938715751206983089175426246389571517462390"
# One H100: a machine start plus a rerun must fit the 15-minute device budget.
TOTAL_BUDGET_S = 420.0
MIN_STAGE_S = 20.0
# The load matrix runs when the build's own load probe fails or a CLI load fails (or with
# --diagnose): a run measured the cause of the fresh-process crash (docs/gpu.md), so a run where the
# loader's fix holds spends its budget on the latency rows instead, and one where it does not
# bisects again.
DIAGNOSE_BY_DEFAULT = False


def text(data: str | bytes | None) -> str:
    """A child's output as text (TimeoutExpired carries bytes even with text=True)."""
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _tail(out: str, lines: int = 12) -> str:
    return "\n".join(out.strip().splitlines()[-lines:])


def run_stage(name: str, argv: list[str], limit: float, log: Path) -> dict:
    """Run one stage in a child with a time limit; its output (text) goes to ``log``."""
    start = time.perf_counter()
    env = dict(os.environ, PYTHONFAULTHANDLER="1")  # a crash in a child leaves its Python stack in the log
    # its own process group: at the limit the whole stage goes (a probe child or a server it
    # started would otherwise hold the pipes open and the check would wait for them)
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=limit)
        rc, out = proc.returncode, text(stdout) + text(stderr)
    except subprocess.TimeoutExpired as exc:
        os.killpg(proc.pid, signal.SIGKILL)
        try:
            stdout, stderr = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a descendant left the group and holds the pipes
            stdout, stderr = text(exc.stdout), text(exc.stderr)
        rc, out = 124, f"{text(stdout)}{text(stderr)}\n(stopped after {limit:.0f} s)"
    seconds = time.perf_counter() - start
    log.write_text(out)
    return {"check": name, "rc": rc, "ok": rc == 0, "seconds": round(seconds, 1), "log": log.name, "tail": _tail(out)}


def skipped(name: str, why: str) -> dict:
    return {"check": name, "rc": None, "ok": True, "skipped": why, "seconds": 0.0, "log": None, "tail": ""}


class Check:
    """The run's budget, its summary (rewritten after every stage) and the stage runner."""

    def __init__(self, out: Path, budget: float, summary: dict, stem: str = "device_check"):
        self.out, self.budget, self.summary, self.stem = out, budget, summary, stem
        self.started = time.perf_counter()

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.started)

    def stage(self, name: str, argv: list[str], limit: float, log: str, minimum: float = MIN_STAGE_S) -> dict:
        """Run ``argv`` within ``min(limit, what is left)``; skipped when less than ``minimum`` is left."""
        left = self.left()
        if left < minimum:
            return self.record(skipped(name, f"budget: {max(left, 0):.0f} s of {self.budget:.0f} s left"))
        return self.record(run_stage(name, argv, min(limit, left), self.out / log))

    def record(self, result: dict) -> dict:
        self.summary["checks"].append(result)
        if result.get("skipped"):
            print(f"SKIP  {result['check']}  ({result['skipped']})", flush=True)
        else:
            print(f"{'PASS' if result['ok'] else 'FAIL'}  {result['check']}  ({result['seconds']} s)", flush=True)
            if not result["ok"]:
                print("      " + result["tail"].replace("\n", "\n      "), flush=True)
        self.write()
        return result

    def write(self) -> None:
        write_summary(self.out, self.summary, self.stem)


def verify_summary(engine: Path) -> dict | None:
    """The verify report's numbers (agreement, logits error, exact accuracy), or None without one."""
    report = engine.with_name(engine.name + ".verify.json")
    if not report.is_file():
        return None
    v = json.loads(report.read_text())
    return {
        "passed": v.get("passed"),
        "examples": v.get("examples"),
        "argmax_agreement": v["logits"]["argmax_agreement"],
        "logits_max_abs": v["logits"].get("max_abs"),
        "logits_max_rel": v["logits"].get("max_rel"),
        "exact": {
            "reference": v.get("reference", {}).get("exact_accuracy"),
            "candidate": v.get("candidate", {}).get("exact_accuracy"),
        },
        "failures": v.get("failures"),
    }


def load_check(engine: Path) -> dict | None:
    """The build's probe verdict (a fresh process loading the package), from the manifest."""
    manifest = engine.with_name(engine.name + ".manifest.json")
    return json.loads(manifest.read_text()).get("load_check") if manifest.is_file() else None


def path_ran(log: Path) -> str:
    """Which path a CLI stage ran, from its log: the AOTInductor engine, or its fallback."""
    try:
        body = log.read_text(errors="replace")
    except OSError:
        return "unknown"
    return "fallback (exported program)" if "running its exported program instead" in body else "engine"


class Background:
    """A stage started now in its own process group (output to ``log``) and waited for later."""

    def __init__(self, name: str, argv: list[str], limit: float, log: Path):
        self.name, self.limit, self.log = name, limit, log
        self.start = time.perf_counter()
        self._out = open(log, "w")  # noqa: SIM115 - closed in wait()
        self.proc = subprocess.Popen(
            argv,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONFAULTHANDLER="1"),
            start_new_session=True,
        )

    def wait(self, most: float) -> dict:
        """Its result once it ends, or stopped (rc 124) at its limit or after ``most`` more seconds."""
        left = min(self.limit - (time.perf_counter() - self.start), most)
        try:
            rc = self.proc.wait(timeout=max(left, 0.1))
            note = ""
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            rc, note = 124, f"\n(stopped after {time.perf_counter() - self.start:.0f} s)"
        self._out.close()
        out = self.log.read_text(errors="replace") + note
        self.log.write_text(out)
        seconds = round(time.perf_counter() - self.start, 1)
        return {
            "check": self.name,
            "rc": rc,
            "ok": rc == 0,
            "seconds": seconds,
            "log": self.log.name,
            "tail": _tail(out),
        }


def write_summary(out: Path, summary: dict, stem: str = "device_check") -> None:
    """device_check.json and .md, written whole each time (a run cut short keeps what it learned)."""
    tmp = out / f"{stem}.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(out / f"{stem}.json")
    lines = [f"# GPU device check: {summary['gpu']} (sm {summary['compute_capability']}), torch {summary['torch']}", ""]
    lines += ["| check | result | seconds |", "|---|---|---|"]
    lines += [
        f"| {c['check']} | {'skipped: ' + c['skipped'] if c.get('skipped') else 'pass' if c['ok'] else 'FAIL'} "
        f"| {c['seconds']} |"
        for c in summary["checks"]
    ]
    if "gpu_latency" in summary:
        lines += ["", "Median latency per call (ms), batch 1 / 64 / 1024 (the path that ran):", ""]
        lines += [
            f"- {name}: {' / '.join(str(v) for v in row['median_ms'].values())} ({row.get('path')})"
            for name, row in summary["gpu_latency"].items()
        ]
    for key in (
        "host",
        "load_check",
        "bundled_load_check",
        "verify",
        "verify_path",
        "precision_accuracy",
        "sudoku_size_bf16_verify",
    ):
        if summary.get(key) is not None:
            lines += ["", f"{key}: {json.dumps(summary[key])}"]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")


def finish(check: Check, label: str) -> int:
    """Print the run's last line; 1 where a check failed, else 0."""
    checks = check.summary["checks"]
    failed = [c["check"] for c in checks if not c["ok"]]
    ran = [c for c in checks if not c.get("skipped")]
    print(
        f"{label}: {len(ran) - len(failed)} of {len(ran)} checks passed ({len(checks) - len(ran)} skipped) "
        f"in {time.perf_counter() - check.started:.0f} s"
    )
    return 1 if failed else 0


def new_summary(torch, what: str, budget: float, **extra) -> dict:
    """The summary's head: what the check is, the GPU, torch, CUDA, Python, the budget."""
    import platform

    return {
        "what": what,
        "gpu": torch.cuda.get_device_name(0),
        "compute_capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "budget_s": budget,
        **extra,
        "checks": [],
    }
