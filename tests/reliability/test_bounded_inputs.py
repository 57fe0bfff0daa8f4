"""Every input bounded, every parse error one line: ONNX files that are not ONNX (truncated,
random, /dev/zero, a FIFO), every artifact kind the suffix table knows (.pt2), numeric options
(threads, dataset counts, serve's batch), pool workers that die with their parent, a port in
use, solve --url within the server's batch and an interrupted solve that keeps its answers."""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
PUZZLE = "0" * 81


def _one_line(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and needle in result.output, result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1, result.output


def _cli(*argv: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "hrm_deploy", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


# ------------------------------------------------------------------------------- ONNX that is not ONNX
@pytest.fixture
def not_onnx(tiny_onnx, tmp_path):
    files = {}
    files["truncated"] = tmp_path / "truncated.onnx"
    files["truncated"].write_bytes(Path(tiny_onnx.unrolled).read_bytes()[:3000])
    files["random"] = tmp_path / "random.onnx"
    files["random"].write_bytes(np.random.default_rng(0).bytes(200_000))
    files["empty"] = tmp_path / "empty.onnx"
    files["empty"].write_bytes(b"")
    files["zero"] = tmp_path / "zero.onnx"
    files["zero"].symlink_to("/dev/zero")
    files["fifo"] = tmp_path / "fifo.onnx"
    os.mkfifo(files["fifo"])
    return files


@pytest.mark.slow
def test_files_that_are_not_onnx_are_one_line_in_bounded_time(not_onnx, tiny_onnx, tmp_path):
    """Run as a user would (a child process, so a hang is a timeout, not a stuck test run)."""
    for kind, path in not_onnx.items():
        for argv in (
            ["inspect", str(path)],
            ["verify", str(path), "--data", tiny_onnx.data],
            ["solve", PUZZLE, str(path)],
            ["build-engine", str(path), "--target", "cpu", "-o", str(tmp_path / "out.onnx")],
        ):
            done = _cli(*argv, cwd=tmp_path, timeout=60)
            assert done.returncode == 2, (kind, argv, done.stderr)
            assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1, (kind, argv, done.stderr)
            assert str(path.name) in done.stderr, (kind, argv, done.stderr)


def test_onnx_files_are_size_and_type_checked_before_reading(not_onnx):
    from hrm_deploy.errors import ArtifactError
    from hrm_deploy.onnx_runtime import load_onnx, ort_session

    for path in not_onnx.values():
        for read in (load_onnx, ort_session):
            with pytest.raises(ArtifactError, match="not a regular file|not a readable ONNX|empty"):
                read(path)


# ------------------------------------------------------------------------------- .pt2 everywhere
@pytest.fixture(scope="module")
def pt2(trained_tiny, tmp_path_factory):
    """A PyTorch engine of the trained fixture (the exported-program fallback: no C++ compile)."""
    from hrm_deploy.backends.torch.builder import build_torch_engine
    from hrm_deploy.engines.config import EngineConfig

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler (simulated)")

    folder = tmp_path_factory.mktemp("pt2")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch._inductor, "aoti_compile_and_package", no_compiler)
        result = build_torch_engine(
            trained_tiny.checkpoint,
            EngineConfig(precision="fp32", backend="torch", max_batch=8),
            folder / "m.pt2",
            True,
        )
    return result.path


@pytest.mark.slow
def test_pt2_is_accepted_by_inspect_solve_and_the_provenance_lookup(pt2, trained_tiny, monkeypatch):
    import json

    from hrm_deploy.provenance import checkpoint_of
    from hrm_deploy.runtime.artifact import read_contract

    shown = json.loads(runner.invoke(app, ["inspect", str(pt2)]).output)
    assert shown["artifact_check"] == "ok" and shown["manifest"]["mode"] == "step"
    assert Path(checkpoint_of(pt2)).resolve() == Path(trained_tiny.checkpoint).resolve()  # verify without --data
    contract = read_contract(pt2)  # what serve reads
    assert (contract.kind, contract.seq_len, contract.max_batch) == ("pt2", 81, 8)
    monkeypatch.setattr(torch, "compile", lambda module, **kw: module)
    result = runner.invoke(app, ["solve", PUZZLE, str(pt2), "--json"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout.splitlines()[0])["answer"]) == 81


@pytest.mark.slow
def test_pt2_in_a_triton_repository_is_one_line_naming_what_to_do(pt2, tmp_path):
    result = runner.invoke(app, ["triton-repo", str(pt2), "-o", str(tmp_path / "r")])
    _one_line(result, "hrm-deploy serve")


# ------------------------------------------------------------------------------- numeric bounds
@pytest.mark.parametrize(
    "argv,needle",
    [
        (["build-engine", "x.onnx", "--target", "cpu", "--threads", "100000"], "--threads 100000"),
        (["build-engine", "x.onnx", "--target", "cpu", "--threads", "-1"], "--threads -1"),
        (["train", "--data", "d", "--threads", "100000"], "--threads 100000"),
        (["data", "sudoku", "--train", "1000000000000", "-o", "d"], "examples need about"),
        (["data", "sudoku", "--train", "10", "--augment", "100000000000", "-o", "d"], "examples need about"),
        (["data", "maze", "--train", "1000000000000", "-o", "d"], "examples need about"),
        (["data", "sudoku", "--workers", "100000", "-o", "d"], "--workers 100000"),
    ],
)
def test_numeric_options_are_bounded_before_work(argv, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    _one_line(runner.invoke(app, argv), needle)
    assert time.monotonic() - started < 30 and not list(tmp_path.iterdir())


def test_dataset_size_is_checked_against_the_disk(tmp_path, monkeypatch):
    from hrm_deploy.data import format as fmt
    from hrm_deploy.errors import DataError

    monkeypatch.setattr("hrm_deploy.system.free_disk_bytes", lambda path: 10_000)
    with pytest.raises(DataError, match="on disk"):
        fmt.check_dataset_size(1000, 81, tmp_path / "d")


@pytest.mark.slow
def test_kill_9_of_data_sudoku_takes_its_workers_with_it(tmp_path):
    from tests.serve.helpers import alive, descendants

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "hrm_deploy", "data", "sudoku", "-o", str(tmp_path / "d"), "--train", "200000"]
        + ["--workers", "2", "--max-blanks", "50", "--min-blanks", "45"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, workers = time.monotonic() + 60, set()
        while time.monotonic() < deadline and len(workers) < 2:
            workers = descendants(proc.pid)
            time.sleep(0.2)
        assert len(workers) >= 2, "the pool did not start"
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(alive(p) for p in workers):
            time.sleep(0.2)
        assert not [p for p in workers if alive(p)], "pool workers outlived kill -9 of their parent"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------- serve
def test_serve_on_a_port_in_use_is_one_line_naming_the_port(tiny_onnx):
    import socket

    from tests.serve.helpers import free_ports

    http, grpc, metrics = free_ports(3)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", http))
        busy.listen()
        result = runner.invoke(
            app,
            ["serve", str(tiny_onnx.unrolled), "--http-port", str(http), "--grpc-port", str(grpc)]
            + ["--metrics-port", str(metrics)],
        )
    _one_line(result, f"--http-port {http}")


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["--max-batch", "100000"], "--max-batch 100000: give 1..64"),
        (["--max-batch", "0"], "--max-batch 0"),
        (["--queue-delay-us", "-1"], "--queue-delay-us"),
        (["--model-name", "../x"], "not a plain model name"),
    ],
)
def test_serve_options_are_bounded_before_starting(tiny_onnx, argv, needle):
    from tests.serve.helpers import free_ports

    http, grpc, metrics = free_ports(3)
    ports = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    _one_line(runner.invoke(app, ["serve", str(tiny_onnx.unrolled), *ports, *argv]), needle)


# ------------------------------------------------------------------------------- solve
def test_solve_url_sends_at_most_the_servers_max_batch(monkeypatch, tmp_path):
    import hrm_deploy.serve.client as client
    from hrm_deploy.solve import solve

    sent = []

    def infer_remote(url, feeds, *, model_name="hrm", timeout_s=30.0):
        n = len(feeds["inputs"])
        sent.append(n)
        return {
            "logits": np.zeros((n, 81, 11), np.float32),
            "q_halt_logits": np.zeros((n, 2), np.float32),
            "steps_used": np.full(n, 2, np.int32),
        }

    monkeypatch.setattr(client, "infer_remote", infer_remote)
    monkeypatch.setattr(client, "server_max_batch", lambda url, model_name="hrm": 16)
    puzzles = tmp_path / "p.txt"
    puzzles.write_text("\n".join([PUZZLE] * 100) + "\n")
    assert len(solve(str(puzzles), url="http://127.0.0.1:1", quiet=True)) == 100
    assert sent == [16] * 6 + [4]


def test_an_interrupted_solve_writes_the_answers_so_far_and_says_how_many(monkeypatch, tmp_path):
    import hrm_deploy.backends as runners

    class Runner:
        def __init__(self):
            self.calls = 0

        def activate(self):
            pass

        def close(self):
            pass

        def infer(self, feeds, **kw):
            self.calls += 1
            if self.calls == 3:  # SIGTERM arrives (the CLI turns it into KeyboardInterrupt)
                raise KeyboardInterrupt("signal 15")
            n = len(feeds["inputs"])
            return {"logits": np.zeros((n, 81, 11), np.float32), "q_halt_logits": np.zeros((n, 1), np.float32)}

    monkeypatch.setattr(runners, "open_runner", lambda path, **kw: Runner())
    monkeypatch.setattr("hrm_deploy.solve._model_seq_len", lambda path: 81)
    puzzles = tmp_path / "p.txt"
    puzzles.write_text("\n".join([PUZZLE] * 200) + "\n")
    out = tmp_path / "answers.jsonl"
    ckpt = tmp_path / "m.pt"
    ckpt.write_bytes(b"x")
    result = runner.invoke(app, ["solve", str(puzzles), str(ckpt), "--json", "-o", str(out), "-q"])
    assert result.exit_code == 130, result.output
    assert "wrote the 128 answers computed of 200 puzzles" in result.output
    assert len(out.read_text().splitlines()) == 128


def test_solve_out_never_replaces_the_puzzle_file(tmp_path):
    puzzles = tmp_path / "p.txt"
    puzzles.write_text(PUZZLE + "\n")
    _one_line(runner.invoke(app, ["solve", str(puzzles), "-o", str(puzzles)]), "an output never replaces its input")
    assert puzzles.read_text() == PUZZLE + "\n"


@pytest.mark.slow
def test_out_of_vocabulary_tokens_get_http_400_naming_the_range(tiny_onnx, tmp_path):
    from tests.serve.helpers import ServeProcess, puzzles, serving_unavailable

    why = serving_unavailable()
    if why:
        pytest.skip(why)
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    server = ServeProcess(Path(tiny_onnx.unrolled), tmp_path / "serve.log")
    try:
        server.wait_ready()
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http}", network_timeout=30)
        tokens, ids = puzzles(tiny_onnx.data, 2)

        def ask(x: np.ndarray) -> dict:
            feeds = [
                httpclient.InferInput("inputs", list(x.shape), "INT32"),
                httpclient.InferInput("puzzle_identifiers", [len(x), 1], "INT32"),
            ]
            feeds[0].set_data_from_numpy(x)
            feeds[1].set_data_from_numpy(ids[: len(x)].reshape(-1, 1))
            return client.infer("hrm", feeds)

        for bad in (tokens + 11, tokens - 12):
            with pytest.raises(InferenceServerException) as caught:
                ask(bad)
            assert caught.value.status() == "400", (caught.value.status(), caught.value.message())
            assert "outside the vocabulary 0..10" in caught.value.message()
            assert "Traceback" not in caught.value.message()
        assert ask(tokens).as_numpy("answer").shape == (2, 81)  # and serving goes on
        assert "Traceback" not in server.log.read_text()
    finally:
        if server.proc.poll() is None:
            assert server.stop() == 0


def test_solve_out_never_replaces_the_model(trained_tiny, tmp_path):
    import shutil

    ckpt = tmp_path / "m.pt"
    shutil.copy(trained_tiny.checkpoint, ckpt)
    before = ckpt.read_bytes()
    _one_line(runner.invoke(app, ["solve", PUZZLE, str(ckpt), "-o", str(ckpt)]), "an output never replaces its input")
    assert ckpt.read_bytes() == before


@pytest.mark.parametrize("argv", [["inspect", "{x}"], ["export", "{x}", "-o", "q.onnx"], ["solve", PUZZLE, "{x}"]])
def test_a_checkpoint_that_is_a_device_or_fifo_is_one_line(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkfifo("fifo.pt")
    Path("zero.pt").symlink_to("/dev/zero")
    for name in ("fifo.pt", "zero.pt"):
        _one_line(runner.invoke(app, [a.replace("{x}", name) for a in argv]), "not a regular file or folder")
