"""Progress lines with ETA, stage heartbeats and status lines when stderr is not a terminal
(CI logs, nohup); nothing when quiet."""

import io
import re
import threading
import time

import pytest

from hrm_deploy import progress as progress_mod
from hrm_deploy.progress import Stages, progress


def test_progress_prints_eta_lines_when_not_a_terminal(capsys, monkeypatch):
    clock = iter(float(t) for t in range(0, 1000, 3))
    monkeypatch.setattr(progress_mod.time, "perf_counter", lambda: next(clock))
    with progress(10, "calibrating", every=5.0, unit="batches") as advance:
        for _ in range(10):
            advance(1)
    lines = capsys.readouterr().err.strip().splitlines()
    assert 2 <= len(lines) < 10  # throttled, and always a final line
    assert re.search(r"calibrating: \d+/10 batches \(\d+ %\), [\d.]+ batches/s, elapsed \d+ s, ETA \d+ s", lines[0])
    assert lines[-1].startswith("    calibrating: 10/10 batches (100 %)") and lines[-1].endswith("ETA 0 s")


def test_progress_quiet_prints_nothing(capsys):
    with progress(3, "x", quiet=True) as advance:
        advance(3)
    assert capsys.readouterr().err == ""


def test_progress_resumed_run_counts_its_own_rate_and_shows_the_note(capsys, monkeypatch):
    clock = iter(float(t) for t in range(0, 1000, 10))
    monkeypatch.setattr(progress_mod.time, "perf_counter", lambda: next(clock))
    with progress(100, "train", every=5.0, unit="steps", done=90) as advance:
        advance.note("loss 0.123")
        advance(1)
    (line,) = capsys.readouterr().err.rstrip().splitlines()
    # 1 step in 10 s since the resume (not 91): 0.10 steps/s, 9 steps left
    assert line == "    train: 91/100 steps (91 %), 0.10 steps/s, elapsed 10 s, ETA 1:30; loss 0.123"


def test_progress_finished_within_the_interval_prints_nothing(capsys):
    with progress(3, "x", every=60.0) as advance:
        advance(3)
    assert capsys.readouterr().err == ""


def _progress_threads():
    return [t for t in threading.enumerate() if t.name.startswith("progress: ")]


@pytest.mark.slow
def test_stage_heartbeat_in_a_log_then_silence(capsys):
    stages = Stages(every=0.01, heartbeat=0.03)
    with stages.stage("folding with onnxslim"):
        (ticker,) = _progress_threads()
        assert ticker.daemon
        time.sleep(0.3)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "... folding with onnxslim" and re.fullmatch(r"    done in \d+\.\d s", err[-1])
    beats = err[1:-1]
    assert beats and all(re.fullmatch(r"    folding with onnxslim: running, elapsed \d+ s", b) for b in beats)
    assert len(beats) < 30  # one per heartbeat interval, not one per tick
    assert not _progress_threads()  # stopped and joined when the stage ended...
    time.sleep(0.1)
    assert capsys.readouterr().err == ""  # ...so nothing more is printed
    assert stages.timings["folding with onnxslim"] >= 0.3


def test_stage_status_lines_are_throttled_and_stop_with_an_error(capsys):
    stages = Stages(every=0.05, heartbeat=60.0)
    with pytest.raises(RuntimeError), stages.stage("building engine") as status:
        for i in range(40):
            status(f"phase {i}/40")
            time.sleep(0.005)
        time.sleep(0.12)
        raise RuntimeError("builder crashed")
    err = capsys.readouterr().err.splitlines()
    phases = [line for line in err if line.startswith("    building engine: phase")]
    assert phases and len(phases) < 10  # at most one per `every`, not one per status
    assert re.fullmatch(r"    building engine: phase 39/40, elapsed \d+ s", phases[-1])
    assert not _progress_threads()


def test_quiet_stage_prints_nothing_and_starts_no_thread(capsys):
    stages = Stages(quiet=True, every=0.01, heartbeat=0.01)
    with stages.stage("tracing") as status:
        assert not _progress_threads()
        status("ignored")
        time.sleep(0.05)
    assert capsys.readouterr().err == "" and "tracing" in stages.timings


def test_terminal_stage_nests_a_progress_bar(monkeypatch):
    from rich.console import Console

    screen = io.StringIO()
    monkeypatch.setattr(progress_mod, "_is_terminal", lambda: True)
    monkeypatch.setattr(progress_mod, "_CONSOLE", Console(file=screen, force_terminal=True, width=120))
    stages = Stages()
    with stages.stage("calibrating INT8") as status:
        status("collecting ranges")
        with progress(4, "batches") as advance:
            advance(4)
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    assert "calibrating INT8: collecting ranges" in shown and "\nbatches ━" in shown  # the bar under the spinner
    assert re.search(r"✓ calibrating INT8 \(\d+\.\d s\)", shown)
