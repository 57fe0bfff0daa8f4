"""A PyTorch step engine one ACT step per call (``runner.step_function()``): driven by the
in-flight scheduler, each puzzle's answer equals the engine's own loop on that puzzle alone, on
the CPU here and (marker ``gpu``) on CUDA."""

from __future__ import annotations

import numpy as np
import pytest

from hrm_deploy.serve.inflight import InflightScheduler
from tests.backends.torch.helpers import examples

pytest.importorskip("torch", reason="torch is not installed (pip install torch)")


def _served_like_alone(engine, data, slots, atol, captured=False):
    """``captured``: the step function's calls must have been replayed from CUDA graphs (a silent
    eager fallback after a failed capture would pass the answers and fail this)."""
    from hrm_deploy.backends import open_runner

    feeds = examples(data, 24).feeds(0, 24)
    inputs, ids = feeds["inputs"].astype(np.int32), feeds["puzzle_identifiers"].astype(np.int32)
    with open_runner(engine, steps=4) as runner:
        # a threshold inside the q_halt values of steps 2-3 (step 1's are the same for every puzzle
        # of this model): the puzzles halt at different steps
        q = runner.infer({"inputs": inputs, "puzzle_identifiers": ids})["q_halt_logits"]
        threshold = float(np.median(q[:, 1:3]))

        def _halt(step, q_halt, q_continue):
            return (q_halt > threshold) & (step > 1)

        alone = [
            runner.infer({"inputs": inputs[i : i + 1], "puzzle_identifiers": ids[i : i + 1]}, halt=_halt)
            for i in range(len(inputs))
        ]
        scheduler = InflightScheduler(runner.step_function(), _halt, slots=slots, queue_limit=64)
        try:  # requests of 1..4 puzzles arriving together: rows join and leave at every step
            cuts = [0, 1, 3, 6, 10, 11, 15, 18, 22, 24]
            tickets = [scheduler.submit(inputs[a:b], ids[a:b]) for a, b in zip(cuts, cuts[1:])]
            for ticket in tickets:
                assert ticket.wait(120) and ticket.error is None, ticket.error
        finally:
            scheduler.stop(1)
        if captured:
            step = runner.step_function()
            assert step.loop.capture_error is None and step.cuda_graph, step.loop.capture_error
            assert any(p.extra.get("step_graphs") for p in step.loop.plans.values())
    got = {k: np.concatenate([t.outputs()[k] for t in tickets]) for k in ("logits", "steps_used")}
    want = {k: np.concatenate([a[k] for a in alone]) for k in ("logits", "steps_used")}
    assert len(set(want["steps_used"].tolist())) > 1  # the rule spread the puzzles over steps
    np.testing.assert_array_equal(got["steps_used"], want["steps_used"])
    np.testing.assert_array_equal(got["logits"].argmax(-1), want["logits"].argmax(-1))
    np.testing.assert_allclose(got["logits"], want["logits"], rtol=0, atol=atol)


@pytest.mark.slow
@pytest.mark.parametrize("slots", [3, 8])
def test_cpu_step_engine_served_in_flight_answers_like_each_puzzle_alone(torch_engines, slots):
    # CPU kernels may round by batch size: logits agree to 1e-4, answers and steps exactly
    _served_like_alone(torch_engines.step, torch_engines.data, slots, atol=1e-4)


@pytest.mark.gpu
def test_gpu_step_engine_served_in_flight_answers_like_each_puzzle_alone(cuda_engine, trained_tiny):
    _served_like_alone(cuda_engine, trained_tiny.data, 8, atol=1e-3, captured=True)
