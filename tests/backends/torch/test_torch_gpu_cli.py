"""What a user does with a PyTorch engine on a GPU, each step a fresh ``hrm-deploy`` process:
build it in one process, then ``verify``, ``solve`` a file, ``bench`` and ``serve`` one request
from others (a package loaded only in the process that compiled it proves nothing about these)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[3]
PUZZLE = "175604839462893157893751642930517264624938715751206983089175426246389571517462390"


def _cli(*args: object, cache: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "HRM_DEPLOY_CACHE": str(cache), "PYTHONFAULTHANDLER": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    argv = [sys.executable, "-m", "hrm_deploy", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def _ok(run: subprocess.CompletedProcess) -> str:
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    return run.stdout


@pytest.fixture(scope="module")
def cli_engine(trained_tiny, tmp_path_factory):
    """A CUDA step engine of the trained fixture, built by ``build-engine`` in its own process."""
    folder = tmp_path_factory.mktemp("gpu_cli")
    engine = folder / "tiny.step.cuda.pt2"
    _ok(
        _cli(
            "build-engine",
            trained_tiny.checkpoint,
            "--backend",
            "torch",
            "--max-batch",
            "1024",
            "-o",
            engine,
            "-q",
            cache=folder / "cache",
        )
    )
    manifest = json.loads(engine.with_name(engine.name + ".manifest.json").read_text())
    assert manifest["device"] == "cuda" and manifest["tf32"] is False
    return engine, folder / "cache"


def test_gpu_cli_verify_in_a_fresh_process(cli_engine, trained_tiny):
    engine, cache = cli_engine
    _ok(_cli("verify", engine, "--data", trained_tiny.data, "--samples", "64", cache=cache))
    report = json.loads(engine.with_name(engine.name + ".verify.json").read_text())
    assert report["passed"] and report["runner"] == "torch_engine", report.get("failures")
    manifest = json.loads(engine.with_name(engine.name + ".manifest.json").read_text())
    assert manifest["load_check"]["ok"], manifest["load_check"]  # the build's probe: a fresh process loads it


def test_gpu_cli_solve_a_file(cli_engine, tmp_path):
    engine, cache = cli_engine
    puzzles = tmp_path / "puzzles.txt"
    puzzles.write_text(f"{PUZZLE}\n{PUZZLE.replace('0', '.')}\n")
    out = _ok(_cli("solve", puzzles, engine, "--json", cache=cache, timeout=300))
    answers = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(answers) == 2 and all(len(a["answer"]) == 81 for a in answers), out


def test_gpu_cli_bench(cli_engine, trained_tiny, tmp_path):
    engine, cache = cli_engine
    _ok(
        _cli(
            "bench",
            engine,
            "--data",
            trained_tiny.data,
            "--batch",
            "1,64",
            "--iters",
            "5",
            "--no-reference",
            "-o",
            tmp_path / "bench",
            cache=cache,
        )
    )
    report = json.loads((tmp_path / "bench" / "report.json").read_text())
    row = report["rows"][0]
    assert row["status"] == "ok" and row["runner"] == "torch_engine", row


def test_gpu_cli_serve_one_request(cli_engine, tmp_path):
    pytest.importorskip("pytriton", reason="serving needs PyTriton (pip install 'hrm-deploy[serve]')")
    pytest.importorskip("tritonclient.http", reason="serving needs tritonclient (pip install 'hrm-deploy[serve]')")
    from tests.serve.helpers import ServeProcess

    engine, cache = cli_engine
    server = ServeProcess(engine, tmp_path / "serve.log")
    try:
        server.wait_ready(timeout_s=240)
        out = _ok(_cli("solve", PUZZLE, "--url", server.url, "--json", cache=cache, timeout=120))
        answers = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        assert len(answers) == 1 and len(answers[0]["answer"]) == 81, out
    finally:
        if server.proc.poll() is None:
            server.stop()
