import pytest
import torch

from hrm_deploy.export.unroll import single_step, unroll, upstream_evaluate


def _batch(cfg, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, cfg.vocab_size, (n, cfg.seq_len), generator=g), torch.zeros(n, dtype=torch.long))


@pytest.mark.slow
def test_unroll_equals_upstream_eval_loop(tiny_model):
    inputs, pids = _batch(tiny_model.config, 3)
    ref = upstream_evaluate(tiny_model, inputs, pids)
    assert torch.all(ref["steps"] == tiny_model.config.halt_max_steps)  # eval never halts early
    with torch.inference_mode():
        logits, q_halt, q_continue = unroll(tiny_model)(inputs, pids)
    assert torch.equal(logits.argmax(-1), ref["logits"].argmax(-1))
    torch.testing.assert_close(logits, ref["logits"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q_halt, ref["q_halt_logits"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(q_continue, ref["q_continue_logits"], rtol=1e-5, atol=1e-5)
    assert q_halt.shape == (3, tiny_model.config.halt_max_steps)


@pytest.mark.slow
def test_unroll_step_count_and_predictions(tiny_model):
    inputs, pids = _batch(tiny_model.config, 2)
    with torch.inference_mode():
        logits, q_halt, _, preds = unroll(tiny_model, steps=2, step_predictions=True)(inputs, pids)
    assert q_halt.shape == (2, 2) and preds.shape == (2, 2, 81) and preds.dtype == torch.int32
    assert torch.equal(preds[:, -1], logits.argmax(-1).int())


@pytest.mark.slow
def test_single_step_loop_equals_unroll(tiny_model):
    cfg = tiny_model.config
    inputs, pids = _batch(cfg, 2, seed=3)
    step = single_step(tiny_model)
    z = torch.zeros(2, cfg.total_seq_len, cfg.hidden_size)
    z_H, z_L = z, z
    halts = []
    with torch.inference_mode():
        for i in range(cfg.halt_max_steps):
            reset = torch.full((2,), i == 0)
            z_H, z_L, logits, q_halt, _ = step(inputs, pids, z_H, z_L, reset)
            halts.append(q_halt)
        ref = unroll(tiny_model)(inputs, pids)
    torch.testing.assert_close(logits, ref[0])
    torch.testing.assert_close(torch.stack(halts, 1), ref[1])


@pytest.mark.slow
def test_reset_is_per_row(tiny_model):
    """A row with reset=False keeps its carry while a reset row restarts (continuous batching)."""
    cfg = tiny_model.config
    inputs, pids = _batch(cfg, 2, seed=4)
    step = single_step(tiny_model)
    z = torch.zeros(2, cfg.total_seq_len, cfg.hidden_size)
    with torch.inference_mode():
        z_H, z_L, *_ = step(inputs, pids, z, z, torch.tensor([True, True]))
        mixed = step(inputs, pids, z_H, z_L, torch.tensor([False, True]))
        fresh = step(inputs, pids, z, z, torch.tensor([True, True]))
        second = step(inputs, pids, z_H, z_L, torch.tensor([False, False]))
    torch.testing.assert_close(mixed[2][1], fresh[2][1])
    torch.testing.assert_close(mixed[2][0], second[2][0])
