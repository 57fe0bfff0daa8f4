import json

import pytest
import torch

from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
from hrm_deploy.errors import ConfigError
from hrm_deploy.model.checkpoint import load_checkpoint
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.train.loop import TrainConfig, lr_at, train
from hrm_deploy.train.optim import AdamATan2

# Measured on held-out puzzles by scripts/refresh_bundled_checkpoint.py --preset sudoku-small
# (benchmarks/results/sudoku_small_preset.json); the bound sits a few points under it for the
# fixture's 100 fresh puzzles.
SMALL_MIN_EXACT = 0.72

MICRO = HRMConfig(
    seq_len=81,
    vocab_size=11,
    hidden_size=32,
    num_heads=2,
    H_layers=1,
    L_layers=1,
    H_cycles=1,
    L_cycles=1,
    halt_max_steps=3,
    puzzle_emb_ndim=32,
)


@pytest.fixture(scope="module")
def micro_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "sudoku"
    generate_sudoku(SudokuSpec(train=40, test=8, blanks=(4, 8), seed=0), str(root))
    return str(root)


def _cfg(data, out, **kw):
    return TrainConfig(
        data_path=data, out_dir=str(out), steps=6, global_batch_size=8, lr=1e-3, lr_warmup_steps=2, eval_samples=8, **kw
    )


@pytest.mark.slow
def test_resume_reaches_the_same_weights(micro_data, tmp_path):
    full = train(MICRO, _cfg(micro_data, tmp_path / "full"), progress=False)
    part = train(MICRO, _cfg(micro_data, tmp_path / "part"), stop_after=3, progress=False)
    resumed = train(MICRO, _cfg(micro_data, tmp_path / "part"), resume=str(part.checkpoint), progress=False)
    a, _ = load_checkpoint(full.checkpoint)
    b, _ = load_checkpoint(resumed.checkpoint)
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), k
    lines = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["final"]["eval"]["count"] == 8 and "samples_per_s" in lines[0]


@pytest.mark.slow
def test_trained_checkpoint_exports(micro_data, tmp_path):
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx

    result = train(MICRO, _cfg(micro_data, tmp_path / "run"), progress=False)
    exported = export_onnx(str(result.checkpoint), tmp_path / "m.onnx", ExportConfig(), quiet=True)
    assert exported.path.is_file()


def test_adam_atan2_matches_formula_and_accepts_zero_lr():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = AdamATan2([p], lr=0.0, betas=(0.9, 0.95), weight_decay=0.1)
    opt.param_groups[0]["lr"] = 0.01
    p.grad = torch.tensor([0.5, -0.25])
    opt.step()
    m, v = 0.1 * p.grad, 0.05 * p.grad**2
    expected = torch.tensor([1.0, -2.0]) * (1 - 0.01 * 0.1) - (0.01 / 0.1) * torch.atan2(m, v.sqrt() / 0.05**0.5)
    torch.testing.assert_close(p.detach(), expected)


def test_schedule_warmup_then_cosine():
    assert lr_at(0, 1.0, 10, 100, 0.1) == 0.0 and lr_at(5, 1.0, 10, 100, 0.1) == 0.5
    assert lr_at(10, 1.0, 10, 100, 0.1) == pytest.approx(1.0)
    assert lr_at(100, 1.0, 10, 100, 0.1) == pytest.approx(0.1)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ddp_two_processes_match_one_process(micro_data, tmp_path):
    """torchrun with 2 CPU ranks (gloo) reaches the weights of one process on the same global batch."""
    import subprocess
    import sys
    from pathlib import Path

    worker = str(Path(__file__).with_name("ddp_worker.py"))
    single = subprocess.run([sys.executable, worker, micro_data, str(tmp_path / "one")], capture_output=True, text=True)
    assert single.returncode == 0, single.stderr[-2000:]

    def torchrun(out: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr"]
        command += ["127.0.0.1", "--master-port", str(_free_port()), worker, micro_data, out]
        return subprocess.run(command, capture_output=True, text=True)

    two = tmp_path / "two"
    ddp = torchrun(str(two))
    if ddp.returncode != 0 and "terminate called without an active exception" in ddp.stderr:
        # Known and not fixed: under load gloo sometimes aborts a rank at exit, after barrier +
        # destroy_process_group (about 1 run in 5 with both cores busy). One rerun; any other
        # failure, or the abort twice, fails the test.
        two = tmp_path / "two-again"
        ddp = torchrun(str(two))
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    a, _ = load_checkpoint(tmp_path / "one" / "last.pt")
    b, _ = load_checkpoint(two / "last.pt")
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(va, vb, atol=1e-5, rtol=1e-4, msg=k)
    carry = torch.load(two / "last.pt", weights_only=True)["carry"]
    assert carry["z_H"].shape[0] == 8  # the saved carry is the global batch's, gathered from both ranks


@pytest.mark.slow
def test_export_upstream_round_trip(micro_data, tmp_path):
    result = train(MICRO, _cfg(micro_data, tmp_path / "run", export_upstream=True), progress=False)
    upstream_file = tmp_path / "run" / "upstream" / "step_6"
    state = torch.load(upstream_file, weights_only=True)
    assert (
        all(k.startswith("_orig_mod.model.inner.") for k in state)
        and state["_orig_mod.model.inner.H_init"].dtype == torch.bfloat16
    )
    ours, ours_cfg = load_checkpoint(result.checkpoint)
    theirs, theirs_cfg = load_checkpoint(upstream_file)  # config from all_config.yaml + the dataset it names
    assert theirs_cfg == ours_cfg
    for (k, va), vb in zip(ours.state_dict().items(), theirs.state_dict().values()):
        torch.testing.assert_close(va, vb, msg=k)


def test_bundled_default_is_trained(trained_tiny):
    """The shipped sudoku-tiny checkpoint solves held-out puzzles it never saw (new seed)."""
    from hrm_deploy.data.format import load_split
    from hrm_deploy.train.loop import evaluate

    model, config = load_checkpoint(trained_tiny.checkpoint)
    metrics = evaluate(model, load_split(trained_tiny.data, "test"))
    assert metrics["count"] == 200 and metrics["exact_accuracy"] >= 0.9, metrics


@pytest.mark.slow
def test_trainer_metrics_are_the_metrics_module_s(micro_data, tmp_path):
    """The trainer logs and evaluates under hrm_deploy.metrics' names, and its evaluation is
    metrics.accuracy of the unrolled model's logits (what verify and bench compute)."""
    import numpy as np

    from hrm_deploy.data.format import load_split
    from hrm_deploy.export.unroll import unroll
    from hrm_deploy.metrics import accuracy
    from hrm_deploy.train.loop import evaluate
    from hrm_deploy.train.sampler import to_batch

    result = train(MICRO, _cfg(micro_data, tmp_path / "run"), progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {"token_accuracy", "exact_accuracy", "q_halt_accuracy"} <= set(rows[0]) and "accuracy" not in rows[0]
    model, _ = load_checkpoint(result.checkpoint)
    split = load_split(micro_data, "test")
    batch = to_batch(split, np.arange(len(split)), split.metadata.ignore_label_id)
    with torch.inference_mode():
        logits = unroll(model.eval())(batch["inputs"], batch["puzzle_identifiers"])[0]
    expected = accuracy(logits.numpy(), batch["labels"].numpy())
    assert evaluate(model, split) == pytest.approx(expected) and result.metrics["eval"] == pytest.approx(expected)


def test_checkpoints_with_the_old_metric_names_read_under_the_new(tiny_model, tmp_path, trained_small):
    """Checkpoints written before the rename (the bundled presets) keep upstream's names on disk."""
    from hrm_deploy.model.checkpoint import read_checkpoint, save_checkpoint

    old = save_checkpoint(
        tmp_path / "old.pt",
        tiny_model,
        metrics={"accuracy": 0.9, "exact_accuracy": 0.5, "eval": {"accuracy": 0.8, "exact_accuracy": 0.4, "count": 3}},
        act_report={"per_step_exact": [0.1, 0.4], "per_step_token": [0.8, 0.9], "final_exact": 0.4},
    )
    extra = read_checkpoint(old).extra
    assert extra["metrics"] == {
        "token_accuracy": 0.9,
        "exact_accuracy": 0.5,
        "eval": {"token_accuracy": 0.8, "exact_accuracy": 0.4, "count": 3},
    }
    assert extra["act_report"] == {
        "per_step_exact_accuracy": [0.1, 0.4],
        "per_step_token_accuracy": [0.8, 0.9],
        "exact_accuracy": 0.4,
    }
    bundled = read_checkpoint(trained_small.checkpoint).extra
    assert 0 < bundled["metrics"]["eval"]["token_accuracy"] <= 1 and "accuracy" not in bundled["metrics"]["eval"]
    report = bundled["act_report"]
    assert report["per_step_exact_accuracy"][-1] == pytest.approx(report["exact_accuracy"], abs=1e-4)


@pytest.mark.slow
def test_bundled_act_model_uses_its_steps(trained_small):
    """The shipped sudoku-small checkpoint (the embedded default) solves held-out puzzles it never
    saw, and its ACT steps matter: exact accuracy after step 1 is well below the final step's."""
    from hrm_deploy.cli.common import bundled_checkpoint
    from hrm_deploy.data.format import load_split
    from hrm_deploy.train.act_eval import act_report, step_outcomes

    assert bundled_checkpoint() == trained_small.checkpoint  # the default model of every command
    model, config = load_checkpoint(trained_small.checkpoint)
    assert config.halt_max_steps >= 8 and config.H_cycles >= 2 and config.L_cycles >= 2
    report = act_report(step_outcomes(model, load_split(trained_small.data, "test")))
    curve = report["per_step_exact_accuracy"]
    assert report["count"] == 100 and curve[-1] >= SMALL_MIN_EXACT, report
    assert round(report["exact_accuracy"], 4) == curve[-1] and len(report["per_step_token_accuracy"]) == len(curve)
    assert curve[0] + 0.2 <= curve[-1] and curve[1] < curve[-1], curve
    with pytest.raises(ConfigError, match="no bundled checkpoint for preset 'nope'"):
        bundled_checkpoint("nope")


@pytest.mark.slow
def test_metric_sinks_log_when_asked_and_fail_clearly_when_missing(micro_data, tmp_path, monkeypatch):
    import sys
    import types

    from hrm_deploy.errors import DependencyError

    logged = []

    class Run:
        def log(self, values, step):
            logged.append((step, values))

        def finish(self):
            logged.append("finished")

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=lambda **kw: Run()))
    train(MICRO, _cfg(micro_data, tmp_path / "run", log_to=("wandb",)), progress=False)
    assert logged[-1] == "finished" and logged[0][0] == 1 and "loss" in logged[0][1]
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(DependencyError, match="pip install wandb"):
        train(MICRO, _cfg(micro_data, tmp_path / "run2", log_to=("wandb",)), progress=False)


def test_preset_train_configs_take_sizes_from_the_data_and_only_given_overrides(micro_data, tmp_path):
    from hrm_deploy.train.presets import PRESETS, train_configs

    model_config, config = train_configs(
        "sudoku-tiny",
        micro_data,
        tmp_path / "run",
        device="cpu",
        threads=1,
        overrides={"steps": 7, "lr": None, "seed": 3},
    )
    assert (model_config.seq_len, model_config.vocab_size) == (81, 11)
    assert model_config.hidden_size == PRESETS["sudoku-tiny"]["model"]["hidden_size"]
    assert (config.steps, config.seed, config.device, config.threads) == (7, 3, "cpu", 1)
    assert config.lr == PRESETS["sudoku-tiny"]["train"]["lr"]  # None means "the preset's"
    assert config.out_dir == str(tmp_path / "run") and config.data_path == micro_data
