"""Latency statistics of repeated timings."""

from __future__ import annotations

import numpy as np


def latency_stats(seconds: list[float], batch: int) -> dict[str, float]:
    """Median / p90 / p99 / mean / std / min in milliseconds and puzzles per second at the median."""
    if not seconds:
        raise ValueError("no timings")
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    median = float(np.percentile(ms, 50))
    return {
        "median_ms": median,
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
        "std_ms": float(ms.std()),
        "min_ms": float(ms.min()),
        "iterations": int(ms.size),
        "puzzles_per_s": batch * 1e3 / median if median > 0 else float("inf"),
    }
