"""Progress lines with ETA when stderr is not a terminal (CI logs, nohup)."""

import re

from hrm_deploy import progress as progress_mod
from hrm_deploy.progress import progress


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
