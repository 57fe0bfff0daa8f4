"""A loop graph (``export --mode loop``) behind a real tritonserver: ``serve`` with dynamic batching
and a ``triton-repo`` repository answer as the in-process runner, early halting included."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.serve.helpers import ServeProcess, repository_server, serving_unavailable

_WHY_NOT = serving_unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")]


@pytest.fixture(scope="module")
def loop_graph(bundled_export) -> tuple[Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The bundled model's loop graph with the q rule, 24 puzzles and the in-process runner's answers."""
    from hrm_deploy.backends import open_runner
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    path = bundled_export("sudoku-small", "loop", "q")
    split = generate_sudoku(SudokuSpec(train=0, test=24, blanks=(10, 30), augment=0, seed=3))["test"]
    feeds = {"inputs": split.inputs.astype(np.int32), "puzzle_identifiers": np.zeros(24, np.int32)}
    with open_runner(path) as runner:
        out = runner.infer(feeds)
    assert out["steps_used"].min() < out["steps_used"].max()  # rows really halt at different steps
    return path, feeds, out


def test_serve_answers_each_request_as_the_runner_alone(loop_graph, tmp_path: Path) -> None:
    from hrm_deploy.serve.client import infer_remote

    path, feeds, ref = loop_graph
    proc = ServeProcess(path, tmp_path / "serve.log", "--max-batch", "8")
    try:
        proc.wait_ready()

        def one(i: int) -> dict[str, np.ndarray]:
            request = {k: v[i : i + 1] for k, v in feeds.items()}
            return infer_remote(proc.url, request, timeout_s=60)

        with ThreadPoolExecutor(6) as pool:  # concurrent requests: Triton batches them
            answers = list(pool.map(one, range(24)))
    finally:
        assert proc.stop() == 0, proc.log.read_text()[-2000:]
    assert "dynamic batching" in proc.log.read_text()
    assert np.array_equal(np.concatenate([a["answer"] for a in answers]), ref["logits"].argmax(-1))
    assert np.array_equal(np.concatenate([a["steps"] for a in answers]).ravel(), ref["steps_used"])


def test_a_triton_repository_of_the_loop_graph_answers(loop_graph, tmp_path: Path) -> None:
    """PyTriton's tritonserver has only the Python backend, so the graph runs in ONNX Runtime inside
    it (``--onnx-backend python``); the ``onnxruntime`` backend's config is the same I/O."""
    from hrm_deploy.serve.client import infer_remote
    from hrm_deploy.serve.repo import OnnxBackend, RepoConfig, write_triton_repo

    path, feeds, ref = loop_graph
    repo = tmp_path / "repo"
    write_triton_repo([path], RepoConfig(output=repo, onnx_backend=OnnxBackend.python, names=("loop",), max_batch=8))
    with repository_server(repo) as url:
        out = infer_remote(url, {k: v[:8] for k, v in feeds.items()}, model_name="loop")
    assert np.array_equal(out["answer"], ref["logits"][:8].argmax(-1))
    assert np.array_equal(np.asarray(out["steps"]).ravel(), ref["steps_used"][:8])


def test_a_loop_graph_keeps_the_rule_fixed_at_its_export(loop_graph, tmp_path: Path) -> None:
    """`triton-repo` of a loop graph exported with --halt q accepts --halt q and refuses another rule in one
    line; `serve --batching inflight` says it is a loop graph and what to serve instead."""
    from typer.testing import CliRunner

    from hrm_deploy.cli import app
    from tests.serve.helpers import free_ports

    path, _, _ = loop_graph
    result = CliRunner().invoke(app, ["triton-repo", str(path), "-o", str(tmp_path / "a"), "--halt", "threshold:0.5"])
    assert result.exit_code == 2 and "is a loop graph, which halts by the rule fixed at its export (q)" in result.output
    assert not (tmp_path / "a").exists()
    result = CliRunner().invoke(app, ["triton-repo", str(path), "-o", str(tmp_path / "b"), "--halt", "q"])
    assert result.exit_code == 0, result.output
    http, grpc, metrics = free_ports(3)
    ports = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    result = CliRunner().invoke(app, ["serve", str(path), "--batching", "inflight", *ports])
    assert result.exit_code == 2, result.output
    assert "is a loop graph" in result.output and "unrolled" not in result.output
    assert "export --mode step" in result.output and "--batching dynamic" in result.output
