"""The Runner base class: checks, casts, chunking/padding, timing sums, steps_used, halting pads."""

from __future__ import annotations

import numpy as np
import pytest

from hrm_deploy.errors import ConfigError
from hrm_deploy.runtime.base import Runner


class Toy(Runner):
    """logits = one-hot of the inputs; each row halts after (its first token % 3) + 1 steps when asked."""

    name = "toy"
    supports_halt = True

    def __init__(self, max_batch=None, min_batch=1):
        self.max_batch, self.min_batch, self.steps, self.seen = max_batch, min_batch, 3, []
        self.closed = 0

    def _activate(self):
        self.seq_len = 4

    def _infer(self, feeds, halt):
        batch = len(feeds["inputs"])
        self.seen.append((batch, feeds["inputs"].dtype))
        out = {
            "logits": np.eye(5, dtype=np.float32)[feeds["inputs"]],
            "q_halt_logits": np.zeros((batch, self.steps), np.float32),
        }
        if halt is not None:
            used = feeds["inputs"][:, 0] % 3 + 1
            ran = int(used.max())
            out["q_halt_logits"] = out["q_halt_logits"][:, :ran]
            out["steps_used"] = used.astype(np.int32)
        self.last_timing = {"h2d_ms": 1.0, "compute_ms": 2.0, "d2h_ms": 0.5, "peak_gpu_mib": float(batch)}
        return out

    def _close(self):
        self.closed += 1


def test_chunks_pads_casts_and_sums_timings():
    feeds = {"inputs": np.arange(40, dtype=np.int64).reshape(10, 4) % 5, "puzzle_identifiers": np.zeros(10, np.uint8)}
    with Toy(max_batch=4, min_batch=3) as runner:
        out = runner.infer(feeds)
    assert runner.seen == [(4, np.int32), (4, np.int32), (3, np.int32)]  # the last 2 rows padded to 3
    assert out["logits"].shape == (10, 4, 5) and out["steps_used"].tolist() == [3] * 10
    np.testing.assert_array_equal(out["logits"].argmax(-1), feeds["inputs"])
    timing = runner.last_timing
    assert timing["chunks"] == 3 and timing["compute_ms"] == 6.0 and timing["peak_gpu_mib"] == 4.0
    assert runner.closed == 1


def test_halting_chunks_of_different_lengths_are_nan_padded():
    inputs = np.zeros((4, 4), np.int32)
    inputs[:2, 0] = 2  # chunk 1: 3 steps; chunk 2: 1 step
    with Toy(max_batch=2) as runner:
        out = runner.infer(
            {"inputs": inputs, "puzzle_identifiers": np.zeros(4, np.int32)}, halt=lambda k, h, c: np.ones(len(h), bool)
        )
    assert out["q_halt_logits"].shape == (4, 3)
    assert np.isnan(out["q_halt_logits"][2:, 1:]).all() and not np.isnan(out["q_halt_logits"][:2]).any()
    assert out["steps_used"].tolist() == [3, 3, 1, 1]


def test_runner_without_halting_refuses_a_halt_rule():
    class NoHalt(Toy):
        supports_halt = False

    with NoHalt() as runner, pytest.raises(ConfigError, match="cannot halt early"):
        runner.infer(
            {"inputs": np.zeros((1, 4), np.int32), "puzzle_identifiers": np.zeros(1, np.int32)},
            halt=lambda k, h, c: h > 0,
        )
