"""Device-loop behaviour a GPU user meets first, checked on numpy "device" memory with the fake
TensorRT: batch buckets, a bounded plan cache, the eager fallback when capture fails, per-step
answers reduced on the device, and halting with padded rows."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from hrm_deploy.backends.tensorrt import fake_trt
from hrm_deploy.runtime.device_loop import bucket
from hrm_deploy.runtime.memory import HostMemory
from tests.runtime.test_device_loop import fake_backend, feeds, make_engine, open_fake  # noqa: F401


def test_buckets_are_powers_of_two_within_the_profile():
    assert [bucket(n, 1, 1024) for n in (1, 2, 3, 5, 64, 65, 1000, 1024)] == [1, 2, 4, 8, 64, 128, 1024, 1024]
    assert bucket(3, 4, 16) == 4 and bucket(9, 1, 12) == 12  # the profile's ends bound the bucket


def test_every_batch_size_shares_a_few_plans_and_old_plans_are_released(tmp_path):
    path, s = make_engine(tmp_path, steps=2, batch=(1, 64))
    with open_fake(path, steps=2) as runner:
        runner.loop.max_plans = 3
        for n in range(1, 65):
            x = feeds(n, s, seed=n)
            out = runner.infer(x)
            ref = fake_trt.reference(s, x["inputs"], x["puzzle_identifiers"], steps=2)
            np.testing.assert_allclose(out["logits"], ref["logits"], rtol=1e-6, atol=1e-6)
            assert out["logits"].shape[0] == n
        assert list(runner.loop.plans) == [16, 32, 64]  # LRU order, bounded
        live = sum(b.nbytes for p in runner.loop.plans.values() for b in p.device.values())
        assert runner.memory._live == live  # evicted plans' buffers are freed, not leaked


def test_capture_failure_warns_once_and_runs_eagerly_with_the_same_answers(tmp_path, monkeypatch, caplog):
    path, s = make_engine(tmp_path, steps=3)
    x = feeds(4, s)
    ref = fake_trt.reference(s, x["inputs"], x["puzzle_identifiers"], steps=3)

    def broken_capture(self, work):
        self._recording = []
        work()  # part of the loop is enqueued into the graph ...
        self._recording = None
        raise RuntimeError("operation not permitted when stream is capturing")  # ... then the capture dies

    monkeypatch.setattr(HostMemory, "capture", broken_capture)
    with caplog.at_level(logging.WARNING), open_fake(path, steps=3) as runner:
        outs = [runner.infer(x), runner.infer(x), runner.infer(feeds(9, s))]
        assert runner.loop.plans[4].graph is None and runner.loop.plans[16].graph is None
        assert runner.loop.path.startswith("eager (capture failed: RuntimeError")
        assert runner.runtime_settings["loop"] == runner.loop.path
    warnings = [r for r in caplog.records if "capture" in r.getMessage()]
    assert len(warnings) == 1  # once, not per call or per batch size
    for out in outs[:2]:
        np.testing.assert_allclose(out["logits"], ref["logits"], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(out["step_predictions"], ref["step_predictions"])


def test_per_step_answers_cross_as_argmax_not_logits(tmp_path):
    path, s = make_engine(tmp_path, steps=4, vocab=11, seq=9, hidden=12)
    x = feeds(8, s)
    ref = fake_trt.reference(s, x["inputs"], x["puzzle_identifiers"])
    with open_fake(path) as runner:
        out = runner.infer(x)
        assert "logits_hist" not in runner.loop.plans[8].device
        down = runner.last_timing["d2h_bytes"]
    np.testing.assert_array_equal(out["step_predictions"], ref["step_predictions"])
    # final logits [8, 9, 11] f32 + 2 x q history [4, 8] f32 + answers [4, 8, 9] i32
    assert down == 8 * 9 * 11 * 4 + 2 * 4 * 8 * 4 + 4 * 8 * 9 * 4


def test_halting_never_shows_padding_rows_to_the_rule(tmp_path):
    path, s = make_engine(tmp_path, steps=5)
    x = feeds(3, s)  # runs in the bucket of 4
    seen = []

    def halt(step, q_halt, q_continue):
        seen.append(len(q_halt))
        return np.array([step >= 2, step >= 4, False])

    with open_fake(path, steps=5) as runner:
        out = runner.infer(x, halt=halt)
    assert set(seen) == {3}
    np.testing.assert_array_equal(out["steps_used"], [2, 4, 5])
    for row, steps in enumerate((2, 4, 5)):
        ref = fake_trt.reference(s, x["inputs"][row : row + 1], x["puzzle_identifiers"][row : row + 1], steps=steps)
        np.testing.assert_allclose(out["logits"][row], ref["logits"][0], rtol=1e-6, atol=1e-6)


def test_close_releases_graphs_events_and_buffers(tmp_path):
    path, s = make_engine(tmp_path, steps=2)
    runner = open_fake(path, steps=2).activate()
    runner.infer(feeds(4, s))
    plan = runner.loop.plans[4]
    memory = runner.memory
    runner.close()
    assert plan.graph is None and not plan.events and not plan.device and not plan.contexts
    assert memory._live == 0


@pytest.mark.parametrize("rows", [1, 7])
def test_bucket_padding_does_not_change_any_row(tmp_path, rows):
    path, s = make_engine(tmp_path, steps=3)
    x = feeds(rows, s, seed=3)
    with open_fake(path, steps=3, cuda_graph=False) as runner:
        out = runner.infer(x)
    ref = fake_trt.reference(s, x["inputs"], x["puzzle_identifiers"], steps=3)
    np.testing.assert_array_equal(out["step_predictions"], ref["step_predictions"])
    assert out["q_halt_logits"].shape == (rows, 3)


def test_close_releases_the_loop_even_when_saving_a_runtime_cache_fails(tmp_path, monkeypatch):
    path, s = make_engine(tmp_path, steps=2)
    runner = open_fake(path, steps=2).activate()
    runner.infer(feeds(2, s))
    memory = runner.memory

    def failing_save():
        raise OSError("disk full")

    monkeypatch.setattr(runner._adapter, "save_runtime_caches", failing_save)
    with pytest.raises(OSError, match="disk full"):
        runner.close()
    assert runner.loop is None and memory._live == 0  # buffers freed all the same


def test_an_engine_on_a_machine_without_a_gpu_says_so_first(tmp_path, monkeypatch):
    from hrm_deploy import system
    from hrm_deploy.backends import open_runner
    from hrm_deploy.errors import EngineError

    path, _ = make_engine(tmp_path)
    monkeypatch.setattr(system, "has_cuda_gpu", lambda: False)
    with pytest.raises(EngineError, match="no CUDA GPU on this machine"):
        open_runner(path).activate()  # not "needs the Python package tensorrt"
