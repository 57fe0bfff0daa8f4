"""The in-flight scheduler and the wire form, in process (no server): slot refills, oldest first,
cancellation, the queue limit, deadlines and stopping; answers equal the in-process runner's."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hrm_deploy.serve.inflight import Busy, InflightScheduler, batch_independent, prometheus_text
from hrm_deploy.serve.wire import RequestError, check_feeds, decode_request, encode_response


class CountingStep:
    """A step function whose row ``i`` halts after ``inputs[i, 0]`` steps (q_halt = count - k + 0.5):
    carry = the row's step count, logits one-hot at (count + token) % V. ``gate`` (a semaphore),
    when given, holds every call until released, so a test controls the step boundaries."""

    steps = 6

    def __init__(self, vocab: int = 11, gate: threading.Semaphore | None = None):
        self.vocab, self.gate, self.calls, self.resets, self.tokens = vocab, gate, [], [], []

    def initial_carry(self, batch: int):
        return (np.full((batch, 1), 99.0, np.float32),)  # garbage: reset rows must not read it

    def take(self, carry, rows):
        return tuple(c[rows] for c in carry)

    def __call__(self, inputs, puzzle_ids, carry, reset):
        if self.gate is not None:
            assert self.gate.acquire(timeout=10), "test gate never released"
        self.calls.append(len(inputs))
        self.tokens.append(inputs[:, 0].tolist())
        self.resets.append(reset.copy())
        count = np.where(reset[:, None], 0.0, carry[0]) + 1.0
        logits = np.zeros((len(inputs), inputs.shape[1], self.vocab), np.float32)
        hot = (count.astype(int) + inputs) % self.vocab
        np.put_along_axis(logits, hot[..., None], 1.0, -1)
        q_halt = (count[:, 0] - inputs[:, 0] + 0.5).astype(np.float32)
        return (count.astype(np.float32),), logits, q_halt, -q_halt


def halt_positive(step, q_halt, q_continue):
    return q_halt > 0


def _request(ks, seq=4):
    tokens = np.tile(np.asarray(ks, np.int32)[:, None], (1, seq))
    return tokens, np.zeros(len(ks), np.int32)


def test_rows_halt_at_their_own_step_and_slots_refill():
    step = CountingStep()
    sched = InflightScheduler(step, halt_positive, slots=2, queue_limit=16)
    try:
        tokens, ids = _request([1, 3, 2, 6])
        ticket = sched.submit(tokens, ids)
        assert ticket.wait(10) and ticket.error is None
        out = ticket.outputs()
        assert out["steps_used"].tolist() == [1, 3, 2, 6]  # 6 = the model's step count (no halt)
        for row, k in enumerate([1, 3, 2, 6]):
            assert (out["logits"][row].argmax(-1) == (k + tokens[row]) % 11).all()
            assert np.isnan(out["q_halt_logits"][row, k:]).all() and not np.isnan(out["q_halt_logits"][row, :k]).any()
        # two slots: rows 0,1 start; row 0 halts at step 1 and row 2 joins (reset) at the next step
        assert max(step.calls) == 2 and step.resets[1].tolist() == [False, True]
        assert sum(step.calls) == 1 + 3 + 2 + 6  # a freed slot never runs an idle row
        gauges = sched.gauges()
        assert gauges["puzzles_answered_total"] == 4 and gauges["steps_per_answer"] == 3.0
        assert 'hrm_inflight_slots_busy{model="m"} 0' in prometheus_text(gauges, "m")
    finally:
        sched.stop(1)


def test_oldest_first_and_cancelled_requests_leave():
    gate = threading.Semaphore(0)
    step = CountingStep(gate=gate)
    sched = InflightScheduler(step, halt_positive, slots=1, queue_limit=16)
    try:
        first = sched.submit(*_request([3]))
        second = sched.submit(*_request([1]))
        gone = sched.submit(*_request([4]))
        last = sched.submit(*_request([2]))
        gone.cancel()  # the client left while queued: its puzzle never runs
        for _ in range(8):
            gate.release()
        assert first.wait(10) and second.wait(10) and last.wait(10)
        assert not gone.done.is_set()
        # one slot, arrival order; the cancelled puzzle took no step
        assert step.tokens == [[3], [3], [3], [1], [2], [2]]
        assert first.steps_used.tolist() == [3] and last.steps_used.tolist() == [2]
    finally:
        for _ in range(20):
            gate.release()
        sched.stop(1)


@pytest.mark.slow
def test_queue_limit_deadline_and_stop():
    gate = threading.Semaphore(0)
    sched = InflightScheduler(CountingStep(gate=gate), halt_positive, slots=1, queue_limit=3)
    try:
        running = sched.submit(*_request([6]))
        deadline = time.monotonic() + 10
        while sched.gauges()["slots_busy"] < 1 and time.monotonic() < deadline:  # it took its slot
            time.sleep(0.01)
        queued = sched.submit(*_request([1, 1, 1]))
        with pytest.raises(Busy, match="limit 3") as busy:
            sched.submit(*_request([1]))
        assert busy.value.retry_after_s >= 1
        queued.deadline = time.monotonic() - 1
        gate.release()  # one step: the loop sees the expired request at the next boundary
        assert queued.wait(10) and queued.status == 504
        for _ in range(2):
            gate.release()
        stopper = threading.Thread(target=sched.stop, args=(0.3,))
        stopper.start()
        time.sleep(0.5)
        gate.release()  # the gate lets one more step through after the grace ran out
        stopper.join(10)
        assert running.done.is_set() and running.status == 503 and "stopped" in (running.error or "")
        with pytest.raises(Busy, match="stopping"):
            sched.submit(*_request([1]))
    finally:
        for _ in range(20):
            gate.release()
        sched.stop(0)


def test_the_loop_survives_a_failing_step():
    class Failing(CountingStep):
        def __call__(self, inputs, puzzle_ids, carry, reset):
            if (inputs[:, 0] == 5).any():
                raise RuntimeError("boom")
            return super().__call__(inputs, puzzle_ids, carry, reset)

    step = Failing()
    sched = InflightScheduler(step, halt_positive, slots=1, queue_limit=16)
    try:
        bad = sched.submit(*_request([5, 3]))
        assert bad.wait(10) and bad.status == 500 and "boom" in (bad.error or "")
        good = sched.submit(*_request([2]))
        assert good.wait(10) and good.error is None and good.steps_used.tolist() == [2]
        assert step.tokens == [[2], [2]]  # the failed request's queued puzzle never ran
    finally:
        sched.stop(1)


def test_dynamic_int8_is_named_as_batch_dependent():
    assert batch_independent({"recipe": {"int8": "dynamic"}}) is not None
    assert batch_independent({"recipe": {"int8": "static"}}) is None and batch_independent(None) is None


def test_wire_round_trip_through_tritonclients_parser():
    httpclient = pytest.importorskip("tritonclient.http")
    import json

    tokens = np.arange(8, dtype=np.int32).reshape(2, 4)
    binary = {
        "inputs": [
            {"name": "inputs", "shape": [2, 4], "datatype": "INT32", "parameters": {"binary_data_size": 32}},
            {"name": "puzzle_identifiers", "shape": [2, 1], "datatype": "INT32", "data": [[0], [1]]},
        ],
        "parameters": {"binary_data_output": True},
        "id": "r1",
    }
    head = json.dumps(binary).encode()
    arrays = decode_request(binary, head + tokens.tobytes(), len(head))
    assert np.array_equal(arrays["inputs"], tokens) and arrays["puzzle_identifiers"].tolist() == [[0], [1]]
    outputs = {"answer": tokens, "q_halt_logits": np.array([[0.5, np.nan], [1.0, 2.0]], np.float32)}
    for request in (binary, {**binary, "parameters": {}, "outputs": [{"name": "answer"}, {"name": "q_halt_logits"}]}):
        body, headers = encode_response(request, "hrm", outputs)
        length = headers.get("Inference-Header-Content-Length")
        result = httpclient.InferResult.from_response_body(body, header_length=int(length) if length else None)
        assert np.array_equal(result.as_numpy("answer"), tokens)
        assert np.array_equal(result.as_numpy("q_halt_logits"), outputs["q_halt_logits"], equal_nan=True)
        assert result.get_response()["model_name"] == "hrm"
    with pytest.raises(RequestError, match="outside int32"):
        decode_request({"inputs": [{"name": "inputs", "shape": [1, 1], "data": [2**40]}]}, b"", None)
    with pytest.raises(RequestError, match="outside the vocabulary 0..10"):
        check_feeds(0, tokens + 11, np.zeros(2, np.int32), 4, 11, 1)


@pytest.mark.slow
@pytest.mark.parametrize("artifact", ["step graph", "checkpoint"])
def test_inflight_answers_equal_the_runner_at_several_loads(artifact, trained_small, tmp_path):
    """The bundled sudoku-small model (8 ACT steps, halting on q) as its ONNX step graph and as the
    checkpoint (PyTorch, torch carries): concurrent single- and multi-puzzle requests through 1, 3 and
    8 slots give the in-process runner's answers and step counts bit for bit (the step graph's logits too)."""
    from hrm_deploy.backends import open_runner
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.halting import HaltRule
    from tests.serve.helpers import puzzles

    path = trained_small.checkpoint
    if artifact == "step graph":
        path = export_onnx(path, tmp_path / "s.step.onnx", ExportConfig(mode="step", parity=False), quiet=True).path
    tokens, ids = puzzles(trained_small.data, 40)
    runner = open_runner(path)
    runner.activate()
    halt = HaltRule.parse("q").should_halt
    ref = runner.infer({"inputs": tokens, "puzzle_identifiers": ids}, halt=halt)
    assert len(set(ref["steps_used"].tolist())) > 2, "halting should spread the puzzles over several steps"
    requests = [(i, min(i + 1 + i % 3, 40)) for i in range(0, 40, 3)]  # 1-3 puzzles each, overlapping
    for slots in (1, 3, 8):
        sched = InflightScheduler(runner.step_function(), halt, slots, queue_limit=200)
        got: dict[int, tuple[int, dict]] = {}

        def client(mine, sched=sched, got=got):
            for a, b in mine:
                ticket = sched.submit(tokens[a:b], ids[a:b])
                assert ticket.wait(60) and ticket.error is None
                got[a] = (b, ticket.outputs())

        threads = [threading.Thread(target=client, args=(requests[c::4],)) for c in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        sched.stop(1)
        assert len(got) == len(requests)
        for a, (b, out) in got.items():
            assert np.array_equal(out["steps_used"], ref["steps_used"][a:b]), slots
            assert np.array_equal(out["logits"].argmax(-1), ref["logits"][a:b].argmax(-1)), slots
            if artifact == "step graph":  # ONNX Runtime: the same bits whatever the batch
                assert np.array_equal(out["q_halt_logits"], ref["q_halt_logits"][a:b], equal_nan=True), slots
            else:  # PyTorch's CPU kernels round by batch size: float noise, same answers and steps
                np.testing.assert_allclose(out["q_halt_logits"], ref["q_halt_logits"][a:b], rtol=1e-5, atol=1e-5)
            assert np.abs(out["logits"] - ref["logits"][a:b]).max() < 1e-4, slots
    runner.close()


def test_which_batching_serves_which_artifact(caplog):
    from types import SimpleNamespace

    from hrm_deploy.errors import ConfigError
    from hrm_deploy.serve.server import Batching, ServeConfig, check_queue_limit, inflight_step

    step = CountingStep()
    with_step = SimpleNamespace(name="ort", step_function=lambda: step)

    def unrolled_step():
        raise ConfigError("x.onnx is an unrolled graph; continuous batching needs the step graph")

    unrolled = SimpleNamespace(name="ort", step_function=unrolled_step)
    remote = SimpleNamespace(name="remote")  # no step function
    dynamic_int8 = {"recipe": {"int8": "dynamic"}}

    def config(batching: Batching) -> ServeConfig:
        return ServeConfig(Path("x.onnx"), batching=batching)

    auto, inflight, dynamic = (config(b) for b in (Batching.auto, Batching.inflight, Batching.dynamic))
    assert inflight_step(with_step, None, auto, halt_positive) is step
    assert inflight_step(with_step, None, auto, None) is None  # --halt off: dynamic unless asked
    assert inflight_step(with_step, None, inflight, None) is step
    assert inflight_step(with_step, None, dynamic, halt_positive) is None
    with caplog.at_level("INFO", logger="hrm_deploy.serve.server"):
        for runner, manifest in ((unrolled, None), (remote, None), (with_step, dynamic_int8)):
            assert inflight_step(runner, manifest, auto, halt_positive) is None
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["dynamic batching"] * 3
    for runner, manifest, why in (
        (unrolled, None, "unrolled graph"),
        (remote, None, "no step function"),
        (with_step, dynamic_int8, "dynamic-INT8"),
    ):
        with pytest.raises(ConfigError, match=f"--batching inflight: .*{why}"):
            inflight_step(runner, manifest, inflight, halt_positive)
    check_queue_limit(None, 32)  # the default (8 x max batch)
    check_queue_limit(32, 32)
    with pytest.raises(ConfigError, match="--queue-limit 4: give at least the max batch"):
        check_queue_limit(4, 8)


def test_a_line_per_period_under_load(monkeypatch, caplog):
    from hrm_deploy.serve import inflight

    monkeypatch.setattr(inflight, "LOG_EVERY_S", 0.0)  # every step boundary instead of every minute
    sched = InflightScheduler(CountingStep(), halt_positive, slots=2, queue_limit=16)
    try:
        with caplog.at_level("INFO", logger="hrm_deploy.serve.inflight"):
            ticket = sched.submit(*_request([2, 3]))
            assert ticket.wait(10)
            sched.stop(1)
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("in-flight:")]
        assert lines and "puzzles/s" in lines[-1] and "steps per answer" in lines[-1], lines
    finally:
        sched.stop(0)
