"""Progress display for long stages: a spinner with elapsed time per stage on a
terminal, plain lines elsewhere (CI logs), nothing when quiet."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator


class Stages:
    """``with stages.stage("tracing step graph"): ...`` prints what runs and how long it took."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.timings: dict[str, float] = {}

    @contextlib.contextmanager
    def stage(self, label: str) -> Iterator[None]:
        start = time.perf_counter()
        if self.quiet:
            yield
        elif sys.stderr.isatty():
            from rich.console import Console

            console = Console(stderr=True)
            with console.status(f"{label}..."):
                yield
            console.print(f"[green]✓[/] {label} ({time.perf_counter() - start:.1f} s)")
        else:
            print(f"... {label}", file=sys.stderr, flush=True)
            yield
            print(f"    done in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        self.timings[label] = round(time.perf_counter() - start, 3)


class _LineProgress:
    """Counts work units and prints ``label: done/total (pct), rate, elapsed, ETA`` at most
    every ``every`` seconds (and once at the end) to stderr: for logs, CI and nohup."""

    def __init__(self, total: int, label: str, every: float, unit: str):
        self.total, self.label, self.every, self.unit = max(int(total), 1), label, every, unit
        self.done = 0
        self.start = self.last = time.perf_counter()

    def line(self) -> str:
        elapsed = time.perf_counter() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        eta_text = "ETA ?" if math.isnan(eta) else f"ETA {_clock(eta)}"
        return (
            f"    {self.label}: {self.done}/{self.total} {self.unit} ({100 * self.done / self.total:.0f} %), "
            f"{rate:.2f} {self.unit}/s, elapsed {_clock(elapsed)}, {eta_text}"
        )

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if now - self.last >= self.every or self.done >= self.total:
            self.last = now
            print(self.line(), file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds} s"


@contextlib.contextmanager
def progress(
    total: int, label: str, quiet: bool = False, every: float = 5.0, unit: str = "items"
) -> Iterator[Callable[[int], None]]:
    """``with progress(n, "calibrating") as advance: ... advance(1)``: a bar with ETA on a
    terminal, one plain line every ``every`` seconds otherwise (CI logs, nohup), nothing when quiet.
    ``advance`` takes the number of units just finished."""

    def nothing(n: int = 1) -> None:
        return None

    if quiet:
        yield nothing
        return
    if sys.stderr.isatty():
        from rich.console import Console
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
            console=Console(stderr=True),
            transient=True,
        ) as bar:
            task = bar.add_task(label, total=total)

            def advance(n: int = 1) -> None:
                bar.advance(task, n)

            yield advance
        return
    line = _LineProgress(total, label, every, unit)
    yield line.advance
