"""``adapt`` under torchrun (2 CPU ranks, gloo), as ``train`` runs there: rank 0 alone writes the
dataset, the record and the checkpoint; the adapted table is a one-process run's on the same global
batch (the trainer's own DDP test compares the same way), the base stays bit for bit, an
external-table export answers with the adapted table, and a refused start and ``--resume`` behave as
in one process."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hrm_deploy.arc.adapt import adapt, read_record
from hrm_deploy.io import sha256_file
from tests.arc.conftest import random_arc_model
from tests.arc.test_adapt import _config, _snapshot, _state, new_tasks
from tests.train.test_train import _free_port

ROOT = Path(__file__).resolve().parents[2]
# Known in the trainer's DDP test: under load gloo sometimes aborts a rank at interpreter exit,
# after the work is done and the group destroyed. Accepted only once rank 0 has reported success.
EXIT_ABORT = "terminate called without an active exception"


def _base(tmp: Path) -> tuple[Path, Path]:
    """A tiny random ARC HRM with exploration off (its draws differ per rank, as in the trainer's
    DDP test) and its dataset."""
    from hrm_deploy.model.checkpoint import load_checkpoint, save_checkpoint
    from hrm_deploy.model.hrm import build_model

    checkpoint, data, _ = random_arc_model(tmp)
    _, config = load_checkpoint(checkpoint)
    model = build_model(dataclasses.replace(config, halt_exploration_prob=0.0), seed=0).eval()
    return save_checkpoint(tmp / "base.pt", model), data


def _torchrun(checkpoint: Path, tasks: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    command += ["--master-port", str(_free_port()), "-m", "hrm_deploy", "adapt", str(checkpoint)]
    command += ["--tasks", str(tasks), "-o", str(out), "--num-aug", "3", "--batch-size", "4"]
    command += ["--puzzle-emb-lr", "0.05", "--checkpoint-minutes", "0", "--device", "cpu", "--threads", "1", "-q"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([*command, *extra], env=env, capture_output=True, text=True, timeout=300)


def _finished(run: subprocess.CompletedProcess, steps: int) -> None:
    """Exit 0 (or the known exit abort after success), and rank 0 alone reported."""
    reports = [line for line in run.stdout.splitlines() if line.startswith("wrote ")]
    assert run.returncode == 0 or (EXIT_ABORT in run.stderr and reports), run.stderr[-3000:]
    assert len(reports) == 1 and f"({steps} steps)" in reports[0], run.stdout


@pytest.mark.slow
def test_two_processes_adapt_as_one(tmp_path):
    checkpoint, data = _base(tmp_path)
    tasks = new_tasks(tmp_path / "new")
    base, base_sha = _state(checkpoint), sha256_file(checkpoint)
    rows = base["puzzle_emb.weights"].shape[0]
    two = tmp_path / "two"

    _finished(_torchrun(checkpoint, tasks, two, "--steps", "2", "--base-data", str(data)), 2)
    files = sorted(str(p.relative_to(two)) for p in two.iterdir())
    assert files == [".train.lock", "adapt.json", "data", "last.pt", "metrics.jsonl"], files  # one each, none per rank
    record = read_record(two)
    assert record["world_size"] == 2 and record["status"] == "done" and record["steps_done"] == 2
    assert record["checkpoint_sha256"] == sha256_file(two / "last.pt")
    assert [json.loads(line)["step"] for line in (two / "metrics.jsonl").read_text().splitlines()[:2]] == [1, 2]

    # a start refused on rank 0 stops both ranks with its one line, and changes nothing
    before = _snapshot(two)
    refused = _torchrun(checkpoint, tasks, two, "--steps", "3")
    assert refused.returncode != 0
    assert "already exists and is not empty" in refused.stderr, refused.stderr
    errors = {line for line in refused.stderr.splitlines() if line.startswith("error: ")}
    assert len(errors) == 1, refused.stderr  # every rank stops with rank 0's line
    assert _snapshot(two) == before

    # resumed under torchrun, it ends where one process adapting straight through ends
    _finished(_torchrun(checkpoint, tasks, two, "--steps", "3", "--resume"), 3)
    one = adapt(_config(checkpoint, tasks, tmp_path / "one", steps=3, threads=1, base_data=str(data)), progress=False)
    assert read_record(tmp_path / "one")["world_size"] == 1 and read_record(two)["steps_done"] == 3
    adapted, single = _state(two / "last.pt"), _state(one.checkpoint)
    for key, value in base.items():  # --train embeddings: every base weight and row bit for bit
        if key != "puzzle_emb.weights":
            assert torch.equal(adapted[key], value), key
    table = adapted["puzzle_emb.weights"]
    assert torch.equal(table[:rows], base["puzzle_emb.weights"]) and sha256_file(checkpoint) == base_sha
    assert int((table[rows:] != 0).any(dim=1).sum()) >= 4  # the looked-up rows moved off their zero init
    torch.testing.assert_close(table, single["puzzle_emb.weights"], atol=1e-5, rtol=1e-4)

    # the base's external-table graph answers with the table the two ranks adapted
    from hrm_deploy.arc.adapted_table import load_adapted_table
    from hrm_deploy.arc.evaluate import ArcEvalConfig, arc_eval
    from hrm_deploy.puzzle_table import Placement
    from tests.arc.test_external_table import _export

    external = _export(checkpoint, tmp_path / "ext.onnx", puzzle_emb=Placement.EXTERNAL, parity=False)
    table_given = load_adapted_table(external.path, two, two / "data")
    assert table_given.rows == rows + 8
    config = ArcEvalConfig(ks=(1, 2), quiet=True)
    got = arc_eval(external.path, two / "data", tmp_path / "ext.json", config=config, puzzle_table=table_given)
    want = arc_eval(two / "last.pt", two / "data", tmp_path / "ref.json", config=config)
    assert got["pass_at"] == want["pass_at"]
    assert (tmp_path / "ext.json").read_text() == (tmp_path / "ref.json").read_text()


def test_the_global_batch_splits_over_the_processes(tmp_path):
    """Checked before anything is written: a --batch-size that does not split over the processes is
    one line; the default (up to 32 copies) is a multiple of the process count."""
    from hrm_deploy.arc.adapt import _train_config
    from hrm_deploy.errors import ConfigError

    config = _config("ckpt", tmp_path, tmp_path / "out", batch_size=None)
    assert _train_config(config, tmp_path, 7).global_batch_size == 7  # one process: as before
    assert _train_config(config, tmp_path, 7, world=2).global_batch_size == 6
    assert _train_config(config, tmp_path, 40, world=3).global_batch_size == 30
    with pytest.raises(
        ConfigError, match="--batch-size 3: it does not split over the 2 processes; use a multiple of 2"
    ):
        _train_config(dataclasses.replace(config, batch_size=3), tmp_path, 7, world=2)
