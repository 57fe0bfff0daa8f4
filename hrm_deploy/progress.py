"""Progress display for long stages: a spinner with elapsed time per stage on a
terminal, plain lines elsewhere (CI logs), nothing when quiet."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Iterator


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
