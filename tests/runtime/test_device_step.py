"""A step engine one ACT step per call (runtime.device_step), driven by the halting scheduler and
the in-flight scheduler: on the fake TensorRT over numpy "device" memory, answers per puzzle equal
the engine's own whole-batch loop whatever the slots, the buckets and the rows leaving mid-loop."""

from __future__ import annotations

import numpy as np
import pytest

from hrm_deploy.backends.tensorrt import fake_trt
from hrm_deploy.backends.tensorrt.api import Backend
from hrm_deploy.errors import ConfigError
from hrm_deploy.halting import drive, run_continuous
from hrm_deploy.serve.inflight import InflightScheduler


@pytest.fixture(autouse=True)
def fake_backend(monkeypatch):
    import hrm_deploy.backends.tensorrt.runner as trt_runner

    monkeypatch.setattr(trt_runner, "load_backend", lambda name: Backend("tensorrt", fake_trt))
    fake_trt.CALLS.clear()


def open_engine(tmp_path, **spec):
    from hrm_deploy.backends import open_runner

    path = tmp_path / "fake.engine"
    s = fake_trt.write_engine(path, precision="fp32", **spec)
    return open_runner(path, memory="host").activate(), s


def puzzles(n, s, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, s["V"], (n, s["S"])).astype(np.int32), rng.integers(0, 3, n).astype(np.int32)


def halt(step, q_halt, q_continue):
    return q_halt > 3.0  # the fake's q_halt spreads puzzles over several steps


def alone(runner, inputs, ids):
    """Each puzzle through the engine's own loop, by itself: the answers every schedule must give."""
    outs = [
        runner.infer({"inputs": inputs[i : i + 1], "puzzle_identifiers": ids[i : i + 1]}, halt=halt)
        for i in range(len(inputs))
    ]
    return np.concatenate([o["logits"] for o in outs]), np.concatenate([o["steps_used"] for o in outs])


@pytest.mark.parametrize("slots", [1, 3, 5, 16])
def test_continuous_batching_on_a_step_engine_equals_each_puzzle_alone(tmp_path, slots):
    runner, s = open_engine(tmp_path, steps=6)
    inputs, ids = puzzles(37, s)
    logits, steps = alone(runner, inputs, ids)
    assert len(set(steps.tolist())) > 2  # the halt rule spreads the puzzles over steps
    out = run_continuous(runner.step_function(), inputs, ids, slots, halt)
    np.testing.assert_array_equal(out["steps_used"], steps)
    np.testing.assert_allclose(out["logits"], logits, rtol=0, atol=1e-6)
    runner.close()


def test_compacting_rows_and_changing_buckets_keep_each_rows_carry(tmp_path):
    """drive() drops halted rows (take: device copies into the other half of the pair) and the rows
    shrink through buckets 16 -> 8 -> 4 ...: every row still ends as it does alone."""
    runner, s = open_engine(tmp_path, steps=6)
    inputs, ids = puzzles(13, s, seed=3)
    logits, steps = alone(runner, inputs, ids)
    step_fn = runner.step_function()
    out = drive(step_fn, inputs, ids, halt)
    np.testing.assert_array_equal(out["steps_used"], steps)
    np.testing.assert_allclose(out["logits"], logits, rtol=0, atol=1e-6)
    assert {2, 8, 16} <= set(step_fn.loop.plans)  # 13 rows, then fewer: it moved down the buckets
    runner.close()


def test_a_step_makes_no_allocation_once_its_bucket_has_a_plan(tmp_path):
    runner, s = open_engine(tmp_path, steps=4)
    step_fn = runner.step_function()
    inputs, ids = puzzles(5, s)
    carry = step_fn.initial_carry(5)
    carry, *_ = step_fn(inputs, ids, carry, np.ones(5, bool))  # plan of bucket 8 made here
    before = runner.memory.allocations
    for _ in range(3):
        carry, *_ = step_fn(inputs, ids, carry, np.zeros(5, bool))
    carry = step_fn.take(carry, np.array([0, 2, 4]))
    step_fn(inputs[[0, 2, 4]], ids[[0, 2, 4]], carry, np.zeros(3, bool))  # bucket 4: a new plan
    assert runner.memory.allocations > before
    before = runner.memory.allocations
    step_fn(inputs[[0, 2, 4]], ids[[0, 2, 4]], carry, np.zeros(3, bool))
    assert runner.memory.allocations == before
    runner.close()


def test_taken_rows_continue_from_their_own_carry(tmp_path):
    """take() of rows out of order and non-adjacent: each row continues exactly as it would have."""
    runner, s = open_engine(tmp_path, steps=6)
    step_fn = runner.step_function()
    inputs, ids = puzzles(6, s, seed=5)
    carry = step_fn.initial_carry(6)
    carry, *_ = step_fn(inputs, ids, carry, np.ones(6, bool))
    z = np.zeros((6, s["T"], s["D"]), np.float32)
    z_H, z_L, *_ = fake_trt.step_math(s, inputs, ids, z, z, np.ones(6, bool))
    rows = np.array([4, 1, 2])
    carry = step_fn.take(carry, rows)
    carry, logits, q_halt, _ = step_fn(inputs[rows], ids[rows], carry, np.zeros(3, bool))
    _, _, want, want_q, _ = fake_trt.step_math(s, inputs[rows], ids[rows], z_H[rows], z_L[rows], np.zeros(3, bool))
    np.testing.assert_allclose(logits, want, atol=1e-6)
    np.testing.assert_allclose(q_halt, want_q, atol=1e-6)
    runner.close()


def test_inflight_scheduler_serves_a_step_engine_like_the_engine_alone(tmp_path):
    runner, s = open_engine(tmp_path, steps=6)
    inputs, ids = puzzles(24, s, seed=7)
    logits, steps = alone(runner, inputs, ids)
    scheduler = InflightScheduler(runner.step_function(), halt, slots=5, queue_limit=100)
    try:
        tickets = [scheduler.submit(inputs[i : i + 3], ids[i : i + 3]) for i in range(0, 24, 3)]
        for ticket in tickets:
            assert ticket.wait(10) and ticket.error is None
    finally:
        scheduler.stop(1)
    got = [t.outputs() for t in tickets]
    np.testing.assert_array_equal(np.concatenate([g["steps_used"] for g in got]), steps)
    np.testing.assert_allclose(np.concatenate([g["logits"] for g in got]), logits, rtol=0, atol=1e-6)
    runner.close()


def test_an_unrolled_engine_has_no_step_function_and_says_why(tmp_path):
    from hrm_deploy.backends import open_runner

    path = tmp_path / "unrolled.engine"
    fake_trt.write_engine(path, precision="fp32", mode="unrolled", steps=4)
    with open_runner(path, memory="host") as runner, pytest.raises(ConfigError, match="export --mode step"):
        runner.step_function()


def test_more_rows_than_the_profile_is_one_clear_error(tmp_path):
    runner, s = open_engine(tmp_path, steps=4)
    inputs, ids = puzzles(17, s)
    step_fn = runner.step_function()
    with pytest.raises(ConfigError, match="at most that many slots"):
        step_fn(inputs, ids, step_fn.initial_carry(17), np.ones(17, bool))
    runner.close()


def test_each_bucket_and_half_is_captured_once_then_replayed(tmp_path):
    """After an eager first run per (bucket, pair half) the step replays its graph: the engine is
    no longer enqueued, yet every step still runs and answers stay those of each puzzle alone."""
    runner, s = open_engine(tmp_path, steps=6)
    inputs, ids = puzzles(30, s, seed=11)
    logits, steps = alone(runner, inputs, ids)
    step_fn = runner.step_function()
    run_continuous(step_fn, inputs[:4], ids[:4], 4, halt)  # warm: captures its buckets' halves
    before = dict(fake_trt.CALLS)
    out = run_continuous(step_fn, inputs, ids, 4, halt)
    calls = {k: fake_trt.CALLS[k] - before.get(k, 0) for k in fake_trt.CALLS}
    assert calls.get("executed", 0) > 0 and calls.get("execute_async_v3", 0) < calls["executed"]
    assert all("step_graphs" in plan.extra for plan in step_fn.loop.plans.values())
    np.testing.assert_array_equal(out["steps_used"], steps)
    np.testing.assert_allclose(out["logits"], logits, rtol=0, atol=1e-6)
    runner.close()


def test_a_failed_step_capture_warns_once_and_steps_eagerly(tmp_path, monkeypatch, caplog):
    runner, s = open_engine(tmp_path, steps=6)
    inputs, ids = puzzles(20, s, seed=13)
    logits, steps = alone(runner, inputs, ids)

    def broken(work):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(runner.memory, "capture", broken)
    step_fn = runner.step_function()
    with caplog.at_level("WARNING"):
        out = run_continuous(step_fn, inputs, ids, 5, halt)
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "capture of one ACT step failed" in caplog.records[0].message and not step_fn.cuda_graph
    np.testing.assert_array_equal(out["steps_used"], steps)
    np.testing.assert_allclose(out["logits"], logits, rtol=0, atol=1e-6)
    runner.close()
