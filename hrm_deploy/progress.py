"""Progress display for long stages, on a terminal and in logs, nothing when quiet.

Two displays, both on stderr:

- :class:`Stages` for work of unknown length (tracing, folding, an engine build): a spinner with
  the elapsed time on a terminal; elsewhere (CI logs, ``nohup``) a start line, a line whenever
  the stage reports a new status (at most every ``every`` seconds), a heartbeat with the elapsed
  time when nothing was printed for ``heartbeat`` seconds, and a done line.
- :func:`progress` for counted work (batches, examples, training steps): a bar with ETA on a
  terminal, one ``done/total (pct), rate, elapsed, ETA`` line every ``every`` seconds elsewhere.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

EVERY_S = 5.0  # at most one progress line this often in a log
HEARTBEAT_S = 15.0  # a "still running" line when nothing was printed for this long


class _Log:
    """Plain lines to stderr, remembering when the last one went out: a stage's heartbeat stays
    silent while a nested counted display (or a status change) is already saying something."""

    last = time.perf_counter()

    @classmethod
    def line(cls, text: str) -> None:
        print(text, file=sys.stderr, flush=True)
        cls.last = time.perf_counter()


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds} s"


_CONSOLE: Any = None


def _console() -> Any:
    """The one rich Console every display shares: nested live displays (a calibration bar inside a
    stage's spinner) need the same console to stack instead of overwriting each other."""
    global _CONSOLE
    if _CONSOLE is None:
        from rich.console import Console

        _CONSOLE = Console(stderr=True)
    return _CONSOLE


def _is_terminal() -> bool:
    return sys.stderr.isatty()


class _Ticker:
    """A daemon thread that prints a running stage's status lines and heartbeats in a log.

    It wakes every ``every`` seconds and prints ``label: status, elapsed`` when the status changed
    since its last line, or when no display printed anything for ``heartbeat`` seconds.
    :meth:`stop` takes the same lock as the print, sets the stop flag and joins the thread: no
    line can appear after the stage has ended."""

    def __init__(self, label: str, every: float, heartbeat: float):
        self.label, self.every, self.heartbeat = label, every, heartbeat
        self.status = self._printed = ""
        self.start = time.perf_counter()
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"progress: {label}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.wait(self.every):
            with self._lock:
                if self._stopped.is_set():
                    return
                now = time.perf_counter()
                status = self.status
                if status != self._printed or now - _Log.last >= self.heartbeat:
                    self._printed = status
                    _Log.line(f"    {self.label}: {status or 'running'}, elapsed {_clock(now - self.start)}")

    def say(self, status: str) -> None:
        self.status = status

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
        self._thread.join()


class Stages:
    """``with stages.stage("tracing step graph") as status: ...`` prints what runs and how long it
    took; ``status("phase 2/6: timing tactics")`` says what the stage is doing now (shown on the
    spinner, or as a log line at most every ``every`` seconds). In a log a stage that says nothing
    still prints a heartbeat with its elapsed time every ``heartbeat`` seconds."""

    def __init__(self, quiet: bool = False, every: float = EVERY_S, heartbeat: float = HEARTBEAT_S):
        self.quiet, self.every, self.heartbeat = quiet, every, heartbeat
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, label: str) -> Iterator[Callable[[str], None]]:
        start = time.perf_counter()
        if self.quiet:
            yield _ignore
        elif _is_terminal():
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            console = _console()
            with Progress(
                SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True
            ) as spinner:
                task = spinner.add_task(f"{label}...", total=None)
                yield lambda text: spinner.update(task, description=f"{label}: {text}")
            console.print(f"[green]✓[/] {label} ({time.perf_counter() - start:.1f} s)")
        else:
            _Log.line(f"... {label}")
            ticker = _Ticker(label, self.every, self.heartbeat)
            try:
                yield ticker.say
            finally:
                ticker.stop()
            _Log.line(f"    done in {time.perf_counter() - start:.1f} s")
        self.timings[label] = round(time.perf_counter() - start, 3)


def _ignore(*args: Any) -> None:
    return None


class Tracker:
    """What :func:`progress` yields: call it with the number of units just finished;
    :meth:`note` sets a short text shown after the counts (training: loss, samples/s).
    This base class is the quiet one and shows nothing."""

    def __call__(self, n: int = 1) -> None:
        return None

    def note(self, text: str) -> None:
        return None


class _LineProgress(Tracker):
    """Counts work units and prints ``label: done/total (pct), rate, elapsed, ETA`` at most
    every ``every`` seconds to stderr, and once at the end when it printed before (work done
    within ``every`` seconds prints nothing): for logs, CI and nohup. The rate and ETA count
    only this run's units (a resumed run starts at ``done``)."""

    def __init__(self, total: int, label: str, every: float, unit: str, done: int = 0):
        self.total, self.label, self.every, self.unit = max(int(total), 1), label, every, unit
        self.done = self.first = done
        self.text = ""
        self.reported = False
        self.start = self.last = time.perf_counter()

    def line(self, now: float | None = None) -> str:
        elapsed = (time.perf_counter() if now is None else now) - self.start
        rate = (self.done - self.first) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        eta_text = "ETA ?" if math.isnan(eta) else f"ETA {_clock(eta)}"
        return (
            f"    {self.label}: {self.done}/{self.total} {self.unit} ({100 * self.done / self.total:.0f} %), "
            f"{rate:.2f} {self.unit}/s, elapsed {_clock(elapsed)}, {eta_text}" + (f"; {self.text}" if self.text else "")
        )

    def __call__(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if now - self.last >= self.every or (self.reported and self.done >= self.total):
            self.last, self.reported = now, True
            _Log.line(self.line(now))

    def note(self, text: str) -> None:
        self.text = text


class _BarProgress(Tracker):
    def __init__(self, bar: Any, task: Any):
        self.bar, self.task = bar, task

    def __call__(self, n: int = 1) -> None:
        self.bar.advance(self.task, n)

    def note(self, text: str) -> None:
        self.bar.update(self.task, note=text)


@contextlib.contextmanager
def progress(
    total: int, label: str, quiet: bool = False, every: float = EVERY_S, unit: str = "items", done: int = 0
) -> Iterator[Tracker]:
    """``with progress(n, "calibrating") as advance: ... advance(1)``: a bar with ETA on a
    terminal, one plain line every ``every`` seconds otherwise (CI logs, nohup), nothing when quiet.
    ``advance`` takes the number of units just finished (a :class:`Tracker`); ``done`` units are
    already finished when it starts (a resumed run)."""
    if quiet:
        yield Tracker()
        return
    if _is_terminal():
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[note]}"),
            console=_console(),
            transient=True,
        ) as bar:
            yield _BarProgress(bar, bar.add_task(label, total=total, completed=done, note=""))
        return
    yield _LineProgress(total, label, every, unit, done)
