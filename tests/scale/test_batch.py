"""Batch work on Ray: ``solve FILE --ray`` and ``arc-eval ARTIFACT --ray`` write the same bytes as one
process, a worker killed mid-run costs no answer, a killed driver's run resumes, and the early stop's
parallel schedule runs the same rows as one process's and writes them in its order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from hrm_deploy.arc.evaluate import ArcEvalConfig, arc_eval, output_paths
from hrm_deploy.errors import ConfigError, DependencyError
from hrm_deploy.scale.cluster import RayConfig


@pytest.fixture(scope="module")
def sudoku(small_onnx, tmp_path_factory):
    """300 held-out Sudoku (the bundled model's difficulty) and the bundled model's FP32 export."""
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    folder = tmp_path_factory.mktemp("sudoku")
    generate_sudoku(SudokuSpec(train=10, test=300, blanks=(10, 30), seed=77), str(folder / "data"))
    return folder / "data", small_onnx


def _kill_one_worker(name: str) -> int | None:
    """SIGKILL one Ray worker process of actor class ``name``; its pid (None: none found)."""
    done = subprocess.run(["pgrep", "-f", f"ray::{name}"], capture_output=True, text=True, check=False)
    pids = [int(p) for p in done.stdout.split()]
    if not pids:
        return None
    os.kill(pids[0], signal.SIGKILL)
    return pids[0]


@pytest.mark.slow
def test_solve_on_ray_is_byte_identical_and_survives_a_killed_worker(ray_cluster, sudoku):
    from hrm_deploy.solve import format_solutions, solve

    data, graph = sudoku
    one = format_solutions(solve(str(data), graph, batch=16, quiet=True), as_json=True)
    killed: list[int | None] = []

    def kill_after_first(batch):  # the first answers are in: kill a worker while the rest are in flight
        if not killed:
            killed.append(_kill_one_worker("SolveWorker"))

    config = RayConfig(workers=2)
    on_ray = solve(str(data), graph, batch=16, quiet=True, ray=config, on_solutions=kill_after_first)
    assert killed and killed[0] is not None  # a worker really died mid-run
    assert format_solutions(on_ray, as_json=True) == one  # every answer, in order, byte for byte


@pytest.mark.slow
@pytest.mark.parametrize("early", [False, True], ids=["full", "early-stop"])
def test_arc_eval_on_ray_writes_the_same_submission_and_predictions(ray_cluster, tmp_path, early):
    from tests.arc.conftest import random_arc_model

    checkpoint, data, _ = random_arc_model(tmp_path)
    key = "early_preds" if early else "preds"
    runs = {}
    for name, ray in (("one", None), ("ray", RayConfig(workers=2))):
        config = ArcEvalConfig(ks=(1, 2), batch=4, quiet=True, early_stop=early, ray=ray)
        runs[name] = arc_eval(checkpoint, data, tmp_path / f"{name}.json", config=config)
    assert (tmp_path / "one.json").read_bytes() == (tmp_path / "ray.json").read_bytes()
    one, ray_preds = (output_paths(tmp_path / f"{n}.json")[key].read_bytes() for n in ("one", "ray"))
    assert one == ray_preds and runs["one"]["pass_at"] == runs["ray"]["pass_at"]


@pytest.mark.slow
def test_a_killed_drivers_run_resumes_from_what_it_wrote(ray_cluster, tmp_path, monkeypatch):
    from hrm_deploy.scale import pool
    from tests.arc.conftest import random_arc_model

    checkpoint, data, _ = random_arc_model(tmp_path)
    config = ArcEvalConfig(ks=(1, 2), batch=4, quiet=True, ray=RayConfig(workers=2))
    arc_eval(checkpoint, data, tmp_path / "sub.json", config=config)
    preds = output_paths(tmp_path / "sub.json")["preds"]
    whole = preds.read_bytes()
    record = np.dtype([("row", "<i8"), ("q_halt", "<f8"), ("pred", "u1", (25,))]).itemsize  # a 5x5 canvas
    preds.write_bytes(whole[: 5 * record + 7])  # a driver killed after 5 rows, mid-record
    submitted: list[int] = []
    real_submit = pool.ActorPool.submit
    monkeypatch.setattr(
        pool.ActorPool, "submit", lambda self, key, *p: (submitted.append(key), real_submit(self, key, *p))
    )
    arc_eval(checkpoint, data, tmp_path / "sub.json", config=config)
    assert preds.read_bytes() == whole and min(submitted) == 5  # rows 0-4 were not run again


class _Now:
    """A stand-in for the actor pool: runs each batch at once on a local source and hands results back
    last-in first-out, so batches finish out of order as on a busy cluster."""

    def __init__(self, source):
        self.source, self.queue = source, []

    def submit(self, key, inputs, ids):
        self.queue.append((key, (*self.source.run(inputs, ids), 0.0)))

    def __len__(self):
        return len(self.queue)

    def finished(self):
        return [self.queue.pop()]


def test_the_parallel_early_stop_runs_the_same_rows_and_writes_them_in_one_process_order(tmp_path, monkeypatch):
    """No Ray needed: the early stop's parallel schedule (each test input one chunk at a time, several
    inputs at once, batches finishing out of order) against one process's, on a planted model whose
    copies mostly agree, so rows are really skipped."""
    import hrm_deploy.arc.evaluate as evaluate
    from hrm_deploy.arc.evaluate import _rows
    from hrm_deploy.data.arc import ArcSpec, build_arc
    from hrm_deploy.scale import batch
    from tests.arc.test_data import make_tasks
    from tests.arc.test_early_stop import PlantedSource

    data = tmp_path / "arc"
    build_arc(ArcSpec(str(make_tasks(tmp_path / "src", seed=1)), num_aug=150, max_grid=5), data)
    monkeypatch.setattr(evaluate, "open_source", lambda *a, **k: PlantedSource(data, 1))
    config = ArcEvalConfig(ks=(1, 2, 5), batch=16, quiet=True, early_stop=True)
    one = arc_eval(tmp_path / "m.pt", data, tmp_path / "one.json", config=config)
    assert one["early_stop"]["rows_skipped"] > 0
    # the same run through the parallel schedule, the pool replaced by the out-of-order stand-in
    clock, stopper = evaluate._work_plan(data, config)
    source = PlantedSource(data, 1)
    preds = output_paths(tmp_path / "par.json")["early_preds"]
    rows = _rows(source, data, preds, config, early=True)
    batch._early(_Now(source), 3, rows, preds, None, stopper, lambda n: None)
    batch._canonical_order(rows, preds, stopper)
    assert preds.read_bytes() == output_paths(tmp_path / "one.json")["early_preds"].read_bytes()


def test_ray_options_are_checked_before_any_work(monkeypatch):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    runner = CliRunner()
    alone = runner.invoke(app, ["solve", "1" * 81, "--address", "auto"])
    assert alone.exit_code == 2 and "--address only apply with --ray" in alone.output
    with pytest.raises(ConfigError, match="ray://HOST:PORT"):
        RayConfig(address="10.0.0.1:6379")
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    missing = runner.invoke(app, ["arc-eval", "m.pt", "--data", ".", "--ray"])
    assert missing.exit_code == 2 and "pip install" in missing.output and "[scale]" in missing.output
    from hrm_deploy.scale.cluster import ray_module

    with pytest.raises(DependencyError):
        ray_module()


def test_a_server_url_with_ray_is_one_line():
    from hrm_deploy.solve import solve

    with pytest.raises(ConfigError, match="drop --ray"):
        solve("1" * 81, url="http://127.0.0.1:1", ray=RayConfig())


def test_serve_ray_options_are_checked_before_any_work():
    from typer.testing import CliRunner

    from hrm_deploy.cli import app
    from hrm_deploy.scale.serving import Replicas

    runner = CliRunner()
    alone = runner.invoke(app, ["serve", "m.onnx", "--replicas", "2"])
    assert alone.exit_code == 2 and "--replicas and --autoscale apply with --ray" in alone.output
    assert Replicas.parse(None, "1:4").options(8)["autoscaling_config"]["max_replicas"] == 4
    assert Replicas.parse(3, None).options(8) == {"num_replicas": 3}
    for replicas, autoscale, says in (
        (2, "1:2", "not both"),
        (None, "4:1", "MIN <= MAX"),
        (None, "x", "MIN:MAX"),
        (0, None, ">= 1"),
    ):
        with pytest.raises(ConfigError, match=says):
            Replicas.parse(replicas, autoscale)
