"""Training never loses work: SIGTERM checkpoints and resumes, periodic
checkpoints, non-trainer resumes, existing run folders, bad numbers and data, NaN loss."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from hrm_deploy.cli import app
from hrm_deploy.errors import CheckpointError, ConfigError, DataError
from hrm_deploy.train.loop import TrainConfig, TrainingDiverged, train
from tests.train.test_train import MICRO

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture(scope="module")
def micro_data(tmp_path_factory):
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    root = tmp_path_factory.mktemp("data") / "sudoku"
    generate_sudoku(SudokuSpec(train=40, test=8, blanks=(4, 8), seed=0), str(root))
    return str(root)


def _cfg(data, out, **kw):
    return TrainConfig(
        data_path=data,
        out_dir=str(out),
        **{**dict(steps=6, global_batch_size=8, lr=1e-3, lr_warmup_steps=2, eval_samples=8), **kw},
    )


@pytest.mark.slow
def test_sigterm_checkpoints_then_resume_continues(micro_data, tmp_path):
    out = tmp_path / "run"
    argv = [
        sys.executable,
        "-m",
        "hrm_deploy",
        "train",
        "--data",
        micro_data,
        "--out",
        str(out),
        "--steps",
        "100000",
        "--batch-size",
        "8",
        "--threads",
        "1",
        "--device",
        "cpu",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until a few steps are logged
            log = out / "metrics.jsonl"
            if log.exists() and len(log.read_text().splitlines()) >= 3:
                break
            time.sleep(0.2)
        else:
            pytest.fail("training did not start")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "--resume" in err
    from hrm_deploy.model.checkpoint import read_checkpoint

    saved = read_checkpoint(out / "last.pt")
    assert saved.step and saved.step >= 3 and "optimizer" in saved.extra
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    # without --resume the folder is protected; with it the run continues from the saved step
    refused = runner.invoke(app, ["train", "--data", micro_data, "--out", str(out), "--steps", "4"])
    assert refused.exit_code == 2 and "--resume" in refused.output and "--overwrite" in refused.output
    model_cfg = saved.config
    resumed = train(
        model_cfg,
        _cfg(
            micro_data,
            out,
            steps=saved.step + 2,
            checkpoint_minutes=0,
            global_batch_size=8,
            lr=saved.train_config["lr"],
        ),
        resume=str(out / "last.pt"),
        progress=False,
    )
    assert resumed.metrics["step"] == saved.step + 2


def test_periodic_checkpoint_by_default(micro_data, tmp_path, monkeypatch):
    import hrm_deploy.train.checkpointer as checkpointer
    import hrm_deploy.train.loop as loop

    assert TrainConfig(data_path="x").checkpoint_minutes > 0  # on by default
    clock = iter(range(0, 10**6, 400))  # every step looks 400 s after the previous one
    monkeypatch.setattr(loop.time, "monotonic", lambda: float(next(clock)))
    saves = []
    real = checkpointer.save_checkpoint
    monkeypatch.setattr(
        checkpointer, "save_checkpoint", lambda path, *a, **k: saves.append(Path(path)) or real(path, *a, **k)
    )
    train(MICRO, _cfg(micro_data, tmp_path / "run"), progress=False)
    assert saves.count(tmp_path / "run" / "last.pt") >= 3  # periodic ones plus the final one


def test_an_interrupted_final_evaluation_keeps_the_trained_weights(micro_data, tmp_path, monkeypatch, caplog):
    """Ctrl-C during the final evaluation (the whole test split: minutes at full size on CPU) leaves
    last.pt at the last step, resumable, although no periodic checkpoint was due."""
    import hrm_deploy.train.loop as loop
    from hrm_deploy.model.checkpoint import read_checkpoint

    real = loop.evaluate

    def interrupted(model, split, samples, **kw):
        if samples is None:  # the final evaluation (the periodic ones take eval_samples)
            raise KeyboardInterrupt
        return real(model, split, samples, **kw)

    monkeypatch.setattr(loop, "evaluate", interrupted)
    with pytest.raises(KeyboardInterrupt), caplog.at_level("WARNING", logger="hrm_deploy.train.loop"):
        train(MICRO, _cfg(micro_data, tmp_path / "run", checkpoint_minutes=0), progress=False)
    kept = read_checkpoint(tmp_path / "run" / "last.pt")
    assert kept.step == 6 and "optimizer" in kept.extra
    assert "trained weights (step 6) are in" in caplog.text and "last.pt" in caplog.text


def test_the_final_evaluation_counts_its_puzzles_toward_the_whole_test_split(micro_data, tmp_path, monkeypatch):
    """The final evaluation reports progress over the whole test split (puzzles done of all, and so
    what is left), every puzzle counted once."""
    import contextlib

    import hrm_deploy.train.loop as loop

    real, counted = loop.display.progress, {}

    @contextlib.contextmanager
    def recording(total, label, quiet=False, **kw):
        counted[label] = [total, 0]
        with real(total, label, quiet, **kw) as tracker:

            def advance(n: int = 1) -> None:
                counted[label][1] += n
                tracker(n)

            advance.note = tracker.note  # type: ignore[attr-defined]
            yield advance

    monkeypatch.setattr(loop.display, "progress", recording)
    train(MICRO, _cfg(micro_data, tmp_path / "run", eval_samples=4), progress=False)
    assert counted["final evaluation on the test split"] == [8, 8]  # the micro data's 8 test puzzles


def test_nan_loss_stops_keeping_the_last_good_checkpoint(micro_data, tmp_path, monkeypatch):
    import hrm_deploy.train.loop as loop

    calls = {"n": 0}
    real = loop.act_loss

    def nan_at_step_4(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] == 4 else loss), metrics

    monkeypatch.setattr(loop, "act_loss", nan_at_step_4)
    with pytest.raises(TrainingDiverged, match="step 4") as err:
        train(MICRO, _cfg(micro_data, tmp_path / "run"), progress=False)
    assert "last.pt" in str(err.value)
    from hrm_deploy.model.checkpoint import read_checkpoint

    kept = read_checkpoint(tmp_path / "run" / "last.pt")
    assert kept.step == 3 and all(torch.isfinite(v).all() for v in kept.state_dict.values())


def test_resume_of_a_non_trainer_checkpoint_is_one_line(micro_data, tmp_path):
    from hrm_deploy.cli.common import bundled_checkpoint

    result = runner.invoke(
        app,
        ["train", "--data", micro_data, "--out", str(tmp_path / "r"), "--resume", bundled_checkpoint(), "--steps", "2"],
    )
    assert result.exit_code == 2 and "not a trainer checkpoint" in result.output, result.output
    assert "Traceback" not in result.output and "KeyError" not in result.output


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("lr", float("nan"), "lr must be a finite"),
        ("lr", -1e-3, "lr must be"),
        ("threads", -2, "threads must be"),
        ("lr", 0.0, "lr must be > 0"),
        ("checkpoint_minutes", float("inf"), "checkpoint_minutes"),
    ],
)
def test_bad_numbers_are_refused_up_front(field, value, needle):
    with pytest.raises(ConfigError, match=needle):
        TrainConfig(data_path="x", **{field: value})


def test_cli_nan_lr_is_one_line(micro_data, tmp_path):
    result = runner.invoke(app, ["train", "--data", micro_data, "--out", str(tmp_path / "r"), "--lr", "nan"])
    assert result.exit_code == 2 and "lr must be a finite" in result.output
    assert not (tmp_path / "r").exists()


def _copy_dataset(src: str, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_labels_outside_the_vocabulary_are_refused(micro_data, tmp_path):
    data = _copy_dataset(micro_data, tmp_path / "bad")
    labels_file = next((data / "train").glob("*__labels.npy"))
    labels = np.load(labels_file)
    labels[0, 0] = 57
    np.save(labels_file, labels)
    with pytest.raises(DataError, match="label 57, outside the vocabulary"):
        train(MICRO, _cfg(str(data), tmp_path / "run"), progress=False)
    assert not (tmp_path / "run" / "last.pt").exists()


def test_an_empty_test_split_is_refused(micro_data, tmp_path):
    from hrm_deploy.data.format import FIELDS

    data = _copy_dataset(micro_data, tmp_path / "empty")
    meta = json.loads((data / "test" / "dataset.json").read_text())
    set_name = meta["sets"][0]
    for name in FIELDS:
        path = data / "test" / f"{set_name}__{name}.npy"
        arr = np.load(path)
        if name in ("puzzle_indices", "group_indices"):
            np.save(path, arr[:1])
        else:
            np.save(path, arr[:0])
    with pytest.raises(DataError, match="test split holds no examples"):
        train(MICRO, _cfg(str(data), tmp_path / "run"), progress=False)


@pytest.mark.slow
def test_overwrite_starts_over(micro_data, tmp_path):
    out = tmp_path / "run"
    train(MICRO, _cfg(micro_data, out, steps=2), progress=False)
    with pytest.raises(ConfigError, match="already holds a run"):
        train(MICRO, _cfg(micro_data, out, steps=2), progress=False)
    train(MICRO, _cfg(micro_data, out, steps=3, overwrite=True), progress=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "step" in r] == [1, 2, 3]


def test_resume_rejects_a_damaged_trainer_checkpoint(micro_data, tmp_path):
    out = tmp_path / "run"
    result = train(MICRO, _cfg(micro_data, out, steps=2), progress=False)
    payload = torch.load(result.checkpoint, weights_only=True)
    del payload["optimizer"]
    torch.save(payload, tmp_path / "damaged.pt")
    with pytest.raises(CheckpointError, match="not a trainer checkpoint"):
        train(MICRO, _cfg(micro_data, tmp_path / "other"), resume=str(tmp_path / "damaged.pt"), progress=False)


@pytest.mark.slow
def test_a_second_writer_of_a_run_is_refused_naming_the_holder(micro_data, tmp_path):
    """Two trains of one run folder (a double --resume) would interleave checkpoints and metrics:
    while one holds the folder's lock, the other stops before touching anything."""
    out = tmp_path / "run"
    train(MICRO, _cfg(micro_data, out, steps=2), progress=False)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from hrm_deploy.train.checkpointer import run_lock\n"
            "with run_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        before = (out / "metrics.jsonl").read_bytes()
        with pytest.raises(ConfigError, match=f"another run of train or adapt \\(pid {holder.pid}\\)"):
            train(MICRO, _cfg(micro_data, out, steps=4), resume=str(out / "last.pt"), progress=False)
        assert (out / "metrics.jsonl").read_bytes() == before
    finally:
        holder.kill()
        holder.wait()
    # the holder died: its lock went with it, and the resume proceeds
    train(MICRO, _cfg(micro_data, out, steps=4), resume=str(out / "last.pt"), progress=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "step" in r] == [1, 2, 3, 4]


def test_a_lock_file_that_is_a_folder_is_named_as_one(tmp_path):
    from hrm_deploy.train.checkpointer import LOCK_NAME, run_lock

    (tmp_path / "run" / LOCK_NAME).mkdir(parents=True)
    with (
        pytest.raises(ConfigError, match=r"\.train\.lock is a folder where train and adapt keep their run lock"),
        run_lock(tmp_path / "run"),
    ):
        pass
    assert (tmp_path / "run" / LOCK_NAME).is_dir()  # not ours: left as it was


def test_resume_of_an_upstream_step_file_names_what_resume_takes(micro_data, tmp_path):
    """An upstream step_N without its dataset.json used to suggest --seq-len, a flag train does not have."""
    from hrm_deploy.model.checkpoint import write_upstream_run
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.model.hrm import build_model
    from tests.conftest import TINY

    model = build_model(HRMConfig(**TINY), seed=0)
    step = write_upstream_run(tmp_path / "upstream", model, step=10, data_path="data/nowhere")
    result = runner.invoke(
        app, ["train", "--data", micro_data, "--out", str(tmp_path / "r"), "--resume", str(step), "--steps", "2"]
    )
    assert result.exit_code == 2 and "not a trainer checkpoint" in result.output, result.output
    assert "--seq-len" not in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_resume_with_steps_at_or_below_the_checkpoints_step_says_so(micro_data, tmp_path):
    out = tmp_path / "run"
    train(MICRO, _cfg(micro_data, out, steps=3), progress=False)
    with pytest.raises(ConfigError, match=r"--steps 2: .*last.pt is already at step 3"):
        train(MICRO, _cfg(micro_data, out, steps=2), resume=str(out / "last.pt"), progress=False)
