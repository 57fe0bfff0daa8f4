"""The in-flight ACT driver's bookkeeping, in process: the repository's ``model.py`` run against a stand-in
for Triton's ``triton_python_backend_utils`` (our protocol with it: requests, BLS, release flags,
metrics), and a step model whose row ``i`` halts after ``inputs[i, 0]`` steps. What Triton itself
does with rescheduled requests is tested on the real server in ``test_triton_inflight.py``."""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

VOCAB, SEQ, STEPS = 11, 4, 6
RESCHEDULE = 2


class _Error:
    CANCELLED = 7

    def __init__(self, message: str, code: int | None = None):
        self.text, self.code = message, code

    def message(self) -> str:
        return self.text


class _Response:
    def __init__(self, output_tensors=(), error=None):
        self.tensors = {t.name: t for t in output_tensors}
        self._error = error

    def has_error(self) -> bool:
        return self._error is not None

    def error(self):
        return self._error


class _Tensor:
    def __init__(self, name: str, array):
        self.name, self.array = name, np.asarray(array)

    def as_numpy(self):
        return self.array


class _Metric:
    def __init__(self):
        self.value = None

    def set(self, value: float) -> None:
        self.value = value


class _Family:
    GAUGE = "gauge"
    metric = _Metric()

    def __init__(self, name: str, description: str, kind: str):
        self.name = name

    def Metric(self, labels):  # noqa: N802 - Triton's name
        return _Family.metric


CALLS: list[tuple[list[int], list[bool]]] = []  # (each row's first token, its reset flag) per step call


def counting_step(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Carry = the row's step count (reset rows start at 0); q_halt > q_continue once count >= inputs[:, 0]."""
    tokens, reset = inputs["inputs"], inputs["reset"].reshape(-1)
    CALLS.append((tokens[:, 0].tolist(), reset.tolist()))
    count = np.where(reset, 0.0, inputs["z_H"][:, 0, 0]) + 1.0
    if (tokens[:, 0] == 9).any():
        raise RuntimeError("step model failed")
    logits = np.zeros((len(tokens), SEQ, VOCAB), np.float32)
    np.put_along_axis(logits, ((count[:, None].astype(int) + tokens) % VOCAB)[..., None], 1.0, -1)
    q_halt = (count - tokens[:, 0] + 0.5).astype(np.float32)
    carry = count.astype(np.float32).reshape(-1, 1, 1)
    return {
        "z_H_out": carry,
        "z_L_out": carry,
        "logits": logits,
        "q_halt_logits": q_halt,
        "q_continue_logits": -q_halt,
    }


class _BlsRequest:
    def __init__(self, model_name, requested_output_names, inputs):
        self.inputs = {t.name: t.array for t in inputs}
        self.outputs = requested_output_names

    def exec(self):
        out = counting_step(self.inputs)
        return _Response([_Tensor(n, out[n]) for n in self.outputs])


class Request:
    """One client request as the driver sees it (Triton hands the same one back after a reschedule)."""

    def __init__(self, key: int, k: int, timeout_us: int = 0):
        self.key, self.k, self.timeout_us = key, k, timeout_us
        self.tensors = {
            "inputs": np.full((1, SEQ), k, np.int32),
            "puzzle_identifiers": np.zeros((1, 1), np.int32),
            "START": np.ones((1, 1), np.int32),
        }
        self.flags, self.cancelled = 0, False

    def correlation_id(self) -> int:
        return self.key

    def is_cancelled(self) -> bool:
        return self.cancelled

    def timeout(self) -> int:
        return self.timeout_us

    def set_release_flags(self, flags: int) -> None:
        self.flags = flags


@pytest.fixture
def driver(monkeypatch):
    fake = types.ModuleType("triton_python_backend_utils")
    fake.Tensor = _Tensor
    fake.TritonError = _Error
    fake.InferenceResponse = _Response
    fake.InferenceRequest = _BlsRequest
    fake.MetricFamily = _Family
    fake.TritonModelException = RuntimeError
    fake.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = RESCHEDULE
    fake.get_input_tensor_by_name = lambda r, n: _Tensor(n, r.tensors[n]) if n in r.tensors else None
    fake.get_output_tensor_by_name = lambda r, n: r.tensors[n]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake)
    path = Path(__file__).resolve().parents[2] / "hrm_deploy" / "serve" / "triton_models" / "act_driver.py"
    spec = importlib.util.spec_from_file_location("act_driver_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def make(max_live: int = 4, halt: str = "q"):
        params = {
            "step_model": "m_step",
            "step_inputs": "inputs,puzzle_identifiers,z_H,z_L,reset",
            "step_outputs": "z_H_out,z_L_out,logits,q_halt_logits,q_continue_logits",
            "steps": STEPS,
            "carry_len": 1,
            "hidden_size": 1,
            "vocab_size": VOCAB,
            "num_puzzle_identifiers": 1,
            "halt": halt,
            "schedule": "inflight",
            "max_live": max_live,
        }
        config = {"max_batch_size": max_live, "parameters": {k: {"string_value": str(v)} for k, v in params.items()}}
        model = module.TritonPythonModel()
        model.initialize({"model_config": json.dumps(config), "model_name": "m", "model_version": "1"})
        return model

    make.module = module
    return make


class Scheduler:
    """Triton's part, reduced: every live request goes into the next execute; a rescheduled one comes
    back without START; an answered one leaves."""

    def __init__(self, model):
        self.model, self.live, self.answers = model, [], {}

    def add(self, *requests: Request) -> None:
        self.live += requests

    def step(self) -> None:
        batch, self.live = self.live, []
        for request in batch:
            request.flags = 0
        responses = self.model.execute(batch)
        assert len(responses) == len(batch)
        for request, response in zip(batch, responses):
            if request.flags == RESCHEDULE:
                assert response is None  # Triton's rule for a rescheduled request
                request.tensors["START"] = np.zeros((1, 1), np.int32)
                self.live.append(request)
            else:
                assert response is not None
                self.answers[request.key] = response


def test_each_puzzle_runs_to_its_own_step_and_new_requests_join_between_steps(driver):
    model = driver()
    triton = Scheduler(model)
    triton.add(Request(1, 1), Request(2, 3), Request(3, 2))
    CALLS.clear()
    triton.step()
    assert set(triton.answers) == {1} and len(model.live) == 2
    triton.add(Request(4, 4))  # joins at step 2 of the others, from its own first step
    for _ in range(4):
        triton.step()
    # one step per execute over every live row; a row resets at its first step only
    assert CALLS == [
        ([1, 3, 2], [True, True, True]),
        ([3, 2, 4], [False, False, True]),
        ([3, 4], [False, False]),
        ([4], [False]),
        ([4], [False]),
    ]
    assert not triton.live and not model.live and _Family.metric.value == 0
    for key, k in ((1, 1), (2, 3), (3, 2), (4, 4)):
        response = triton.answers[key]
        assert not response.has_error(), response.error().message()
        assert int(response.tensors["steps"].as_numpy()[0, 0]) == k
        answer = response.tensors["answer"].as_numpy()[0]
        assert (answer == (k + k) % VOCAB).all()  # the halting step's logits: count k, token k
        q_halt = response.tensors["q_halt_logits"].as_numpy()[0]
        assert not np.isnan(q_halt[:k]).any() and np.isnan(q_halt[k:]).all()


def test_cancelled_timed_out_and_dropped_requests_free_their_carries(driver, monkeypatch):
    model = driver()
    triton = Scheduler(model)
    cancelled, late, dropped, good = Request(1, 5), Request(2, 5, timeout_us=1), Request(3, 5), Request(4, 2)
    triton.add(cancelled, late, dropped, good)
    triton.step()
    assert len(model.live) == 4
    cancelled.cancelled = True
    triton.live.remove(dropped)  # Triton dropped it while rescheduled (its client cancelled): never seen again
    monkeypatch.setattr(driver.module, "ORPHAN_S", 0.0)
    for _ in range(4):
        triton.step()
        triton.add(Request(10 + len(triton.answers), 1))  # traffic keeps the executes coming
    assert triton.answers[1].error().code == _Error.CANCELLED
    assert "timed out" in triton.answers[2].error().message()
    assert not triton.answers[4].has_error() and 3 not in triton.answers
    assert set(model.live) <= {k for k in range(10, 20)}  # the dropped request's carry is gone


def test_past_its_live_limit_a_request_gets_an_error_and_others_go_on(driver):
    model = driver(max_live=2)
    triton = Scheduler(model)
    triton.add(Request(1, 3), Request(2, 3), Request(3, 1))
    triton.step()
    assert "in flight (its limit)" in triton.answers[3].error().message()
    bad = Request(4, 1)
    bad.tensors["inputs"] = np.full((1, SEQ), VOCAB + 1, np.int32)
    triton.add(bad)
    triton.step()
    assert "outside the vocabulary" in triton.answers[4].error().message()
    triton.step()
    assert int(triton.answers[1].tensors["steps"].as_numpy()[0, 0]) == 3 and not model.live


def test_a_failing_step_fails_the_requests_of_that_execute_only(driver):
    model = driver()
    triton = Scheduler(model)
    triton.add(Request(1, 9), Request(2, 2))  # token 9 makes the step model raise
    triton.step()
    assert all("ACT step failed" in triton.answers[k].error().message() for k in (1, 2)) and not model.live
    triton.add(Request(3, 2))
    triton.step()
    triton.step()
    assert int(triton.answers[3].tensors["steps"].as_numpy()[0, 0]) == 2
