"""Independent ONNX Runtime calls run side by side, their results taken in submission order.

A quantized build measures a small model on small batches (8 puzzles), where ONNX Runtime's
intra-op threads gain little: on the bundled model (300 puzzles in chunks of 8, 2-core machine,
``benchmarks/ort_streams.py``) one session at 2 threads took 2.0 to 3.8 s a pass (median 2.3), one
at 1 thread 3.1 s, one single-thread session called from two threads at once 1.5 to 1.7 s, the
outputs bit-identical. (In batches of 64 one session does as well as streams: the gain is the
small batches'.) So the build's measurements run their batches as *streams*: sessions of one
thread (of a few on a machine with more cores than :data:`MAX_STREAMS`) called from up to
``streams`` threads at once (ONNX Runtime's ``run`` is thread-safe; the GIL is released while it
runs). Calibration keeps one session at ORT's threads: its batches of 32 gained nothing from
streams.

:func:`in_order` gives the results in the order the work was handed out, and a consumer that stops
early discards what ran ahead of it: what is computed and kept never depends on the number of
streams or on timing, so a build's verdict is the same on any machine.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

from hrm_deploy.system import usable_cores

T = TypeVar("T")
R = TypeVar("R")

# Streams at most: each holds its own chunk's activations (an ARC-size model's attention is ~0.2 GB
# per chunk of 8), so a many-core machine runs a few streams of several threads, not one per core.
MAX_STREAMS = 4


def stream_count(threads: int | None = None) -> int:
    """How many streams a measurement runs on ``threads`` cores (the user's ``--threads``; None:
    every usable core): one per core, at most :data:`MAX_STREAMS`."""
    return max(1, min(MAX_STREAMS, threads or usable_cores()))


def threads_per_stream(threads: int | None = None) -> int:
    """ONNX Runtime intra-op threads of each stream's session: the cores shared among the streams."""
    return max(1, (threads or usable_cores()) // stream_count(threads))


def in_order(work: Callable[[T], R], items: Iterable[T], streams: int) -> Iterator[R]:
    """``work(item)`` for every item, up to ``streams`` running at once, yielded in the items' order.

    While the consumer handles one result the next ``streams`` are under way. Closing the iterator
    early (a ``break``, a failure, an interrupt) cancels the work not started and waits for the work
    running (at most ``streams - 1`` calls), whose results are dropped. ``streams`` 1: each item is
    worked on in the caller's thread, as it is asked for."""
    if streams <= 1:
        for item in items:
            yield work(item)
        return
    left = iter(items)
    with ThreadPoolExecutor(max_workers=streams, thread_name_prefix="hrm-stream") as pool:
        pending: deque[Future[R]] = deque(pool.submit(work, item) for _, item in zip(range(streams), left))
        try:
            while pending:
                done = pending.popleft().result()
                for item in left:  # keep `streams` under way while the consumer works
                    pending.append(pool.submit(work, item))
                    break
                yield done
        finally:
            for future in pending:
                future.cancel()
