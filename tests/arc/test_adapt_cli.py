"""``hrm-deploy adapt`` and ``arc-eval --puzzle-table`` on the command line: the no-rebuild path end to
end, Ctrl-C as ``train`` handles it, and bad input one ``error:`` line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hrm_deploy.cli import app
from tests.arc.test_adapt import new_tasks

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]


def _one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return lines[0]


def test_bad_budgets_are_one_line(arc_run):
    checkpoint, _, tmp = arc_run
    tasks = new_tasks(tmp / "new")
    base = ["adapt", str(checkpoint), "--tasks", str(tasks), "-o", str(tmp.parent / "out"), "-q"]
    assert "--steps 0" in _one_error_line(runner.invoke(app, [*base, "--steps", "0"]))
    assert "--minutes -1.0" in _one_error_line(runner.invoke(app, [*base, "--minutes", "-1"]))
    assert "is in the base checkpoint's folder" in _one_error_line(
        runner.invoke(app, ["adapt", str(checkpoint), "--tasks", str(tasks), "-o", str(tmp), "-q"])
    )
    assert not (tmp.parent / "out").exists()


@pytest.mark.slow
def test_adapt_then_arc_eval_with_the_table_needs_no_rebuild(arc_run):
    checkpoint, data, tmp = arc_run
    graph = tmp / "base.onnx"
    result = runner.invoke(app, ["export", str(checkpoint), "-o", str(graph), "--puzzle-emb", "external", "-q"])
    assert result.exit_code == 0, result.output
    tasks, out = new_tasks(tmp / "new"), tmp / "adapted"
    args = ["--tasks", str(tasks), "-o", str(out), "--steps", "3", "--num-aug", "2", "--batch-size", "3"]
    result = runner.invoke(app, ["adapt", str(checkpoint), *args, "--device", "cpu", "-q"])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and (out / "last.pt").is_file()
    sub = tmp / "ext.json"
    result = runner.invoke(
        app, ["arc-eval", str(graph), "--data", str(out / "data"), "--puzzle-table", str(out), "-o", str(sub), "-q"]
    )
    assert result.exit_code == 0, result.output
    ref = tmp / "ref.json"
    result = runner.invoke(app, ["arc-eval", str(out / "last.pt"), "--data", str(out / "data"), "-o", str(ref), "-q"])
    assert result.exit_code == 0, result.output
    assert json.loads(sub.read_text()) == json.loads(ref.read_text())
    assert sorted(json.loads(sub.read_text())) == ["new0", "new1"]
    # the internal-table graph: one line saying what to export
    embedded = tmp / "emb.onnx"
    assert runner.invoke(app, ["export", str(checkpoint), "-o", str(embedded), "-q"]).exit_code == 0
    line = _one_error_line(
        runner.invoke(app, ["arc-eval", str(embedded), "--data", str(out / "data"), "--puzzle-table", str(out), "-q"])
    )
    assert "--puzzle-emb external" in line


@pytest.mark.slow
def test_sigterm_writes_a_resumable_state(arc_run):
    checkpoint, _, tmp = arc_run
    tasks, out = new_tasks(tmp / "new"), tmp / "adapted"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "hrm_deploy", "adapt", str(checkpoint), "--tasks", str(tasks), "-o", str(out)]
    argv += ["--steps", "100000", "--num-aug", "2", "--batch-size", "3", "--device", "cpu", "-q"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (out / "metrics.jsonl").is_file():
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "continue with --resume" in err
    record = json.loads((out / "adapt.json").read_text())
    assert record["status"] == "interrupted" and 0 < record["steps_done"] < 100000
    done = record["steps_done"]
    result = runner.invoke(
        app,
        ["adapt", str(checkpoint), "--tasks", str(tasks), "-o", str(out), "--steps", str(done + 2), "--resume", "-q"],
    )
    assert result.exit_code == 0, result.output
    assert json.loads((out / "adapt.json").read_text())["steps_done"] == done + 2
