"""Shared helpers of the serving tests: free ports, process trees, a `hrm-deploy serve` child."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def descendants(pid: int) -> set[int]:
    """All live descendant pids of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def describe(pids: set[int]) -> str:
    """``pid: command line`` of each process still there (what outlived the server, for the failure)."""
    lines = []
    for pid in sorted(pids):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            lines.append(f"{pid}: {command[:160]}")
        except OSError:
            lines.append(f"{pid}: (gone)")
    return "; ".join(lines)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class ServeProcess:
    """``python -m hrm_deploy serve ARTIFACT`` on free loopback ports, in its own session."""

    def __init__(self, artifact: Path, log: Path, *extra: str):
        self.http, self.grpc, self.metrics = free_ports(3)
        self.url = f"http://127.0.0.1:{self.http}"
        self.log = log
        cmd = [
            sys.executable,
            "-m",
            "hrm_deploy",
            "serve",
            str(artifact),
            "--http-port",
            str(self.http),
            "--grpc-port",
            str(self.grpc),
            "--metrics-port",
            str(self.metrics),
            *extra,
        ]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        with log.open("w") as out:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.tree: set[int] = set()

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        import tritonclient.http as httpclient

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            with contextlib.suppress(Exception):
                client = httpclient.InferenceServerClient(
                    f"127.0.0.1:{self.http}", connection_timeout=2, network_timeout=2
                )
                if client.is_model_ready("hrm"):
                    self.tree = descendants(self.proc.pid)
                    return
            time.sleep(0.5)
        self.kill()
        raise AssertionError(f"serve not ready in {timeout_s} s:\n{self.log.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        """Signal the server, wait for it; returns its exit code."""
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"serve did not stop within {timeout_s} s of signal {sig}") from None

    def kill(self) -> None:
        """Last resort for a failed test: the whole process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def leftovers(self, timeout_s: float = 20.0) -> set[int]:
        """Pids of the server's tree (tritonserver, stubs) still alive after it stopped."""
        deadline = time.monotonic() + timeout_s
        left = {p for p in self.tree | {self.proc.pid} if alive(p)}
        while left and time.monotonic() < deadline:
            time.sleep(0.3)
            left = {p for p in left if alive(p)}
        return left


def puzzles(data: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    from hrm_deploy.data.examples import load_examples

    ex = load_examples(data, n, split="test")
    return ex.inputs.astype(np.int32), ex.puzzle_identifiers.astype(np.int32)


def serving_unavailable() -> str | None:
    """Why the real-server tests cannot run here (None when they can).

    CI sets HRM_REQUIRE_SERVE=1 after building its venv from the system Python, turning these
    skips into failures there: the serving tests must run for real in CI."""
    import importlib.util
    import os

    reason = None
    missing = [m for m in ("pytriton", "tritonclient") if importlib.util.find_spec(m) is None]
    if missing:
        reason = f"{', '.join(missing)} not installed (pip install 'hrm-deploy[serve]')"
    elif Path(sys.base_prefix).resolve() != Path("/usr"):
        reason = (
            f"PyTriton's bundled tritonserver needs a venv made from the system Python (/usr/bin/python3.x); "
            f"this interpreter lives in {sys.base_prefix}"
        )
    if reason and os.environ.get("HRM_REQUIRE_SERVE") == "1":
        raise RuntimeError(f"HRM_REQUIRE_SERVE=1 but the serving tests cannot run: {reason}")
    return reason


@contextlib.contextmanager
def repository_server(repo: Path):
    """PyTriton's bundled tritonserver serving the model repository ``repo`` on free loopback
    ports; yields its HTTP URL."""
    from pytriton.triton import Triton, TritonConfig

    http, grpc, metrics = free_ports(3)
    config = TritonConfig(
        model_repository=repo,
        http_address="127.0.0.1",
        http_port=http,
        grpc_address="127.0.0.1",
        grpc_port=grpc,
        metrics_address="127.0.0.1",
        metrics_port=metrics,
        allow_gpu_metrics=False,
    )
    with Triton(config=config) as triton:
        triton.run()
        yield f"http://127.0.0.1:{http}"


class StockTriton:
    """PyTriton's bundled ``tritonserver --model-repository REPO`` started as a user starts a stock
    Triton: the binary itself (no PyTriton, no ``hrm-deploy``), its Python backend in a backend
    folder of its own, free loopback ports, its own session (so nothing outlives :meth:`stop`)."""

    def __init__(self, repo: Path, workdir: Path):
        from hrm_deploy.serve.binding import bundled_tritonserver

        self.http, self.grpc, self.metrics = free_ports(3)
        self.url = f"http://127.0.0.1:{self.http}"
        self.log = workdir / "tritonserver.log"
        cmd, env = bundled_tritonserver(
            repo, workdir, http_port=self.http, grpc_port=self.grpc, metrics_port=self.metrics
        )
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"tritonserver exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=2).status == 200:
                    return
            time.sleep(0.3)
        self.stop()
        raise AssertionError(f"tritonserver not ready in {timeout_s} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """SIGTERM to tritonserver (it stops its stubs), SIGKILL of the whole session after 40 s."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)
