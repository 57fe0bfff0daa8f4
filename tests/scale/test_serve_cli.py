"""``hrm-deploy serve GRAPH --ray`` as a user starts it: a local Ray started by the command, the unrolled
graph behind Ray Serve's dynamic batching, answers equal to ``solve``, Prometheus metrics of Ray Serve,
and SIGTERM stopping everything (exit 0, no error line, no Ray process left)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.scale.conftest import ray_processes
from tests.scale.test_serve import free_port

pytestmark = pytest.mark.slow


def test_serve_ray_from_the_command_line_answers_and_stops_clean(small_onnx, tmp_path):
    pytest.importorskip("ray", reason="pip install -e '.[scale]'")
    if ray_processes():
        pytest.skip("another Ray is running on this machine: the check that none is left would be meaningless")
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.solve import format_solutions, solve

    generate_sudoku(SudokuSpec(train=10, test=24, blanks=(10, 30), seed=79), str(tmp_path / "data"))
    port, metrics = free_port(), free_port()
    command = [sys.executable, "-m", "hrm_deploy", "serve", str(small_onnx), "--ray", "--http-port", str(port)]
    command += ["--metrics-port", str(metrics), "--max-batch", "8"]
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = ""
        end = time.monotonic() + 120
        while "serving" not in line:
            assert time.monotonic() < end and server.poll() is None, line
            line = server.stderr.readline()
        assert "Ray Serve (1 replica(s)" in line and f"http://127.0.0.1:{port}" in line
        url = f"http://127.0.0.1:{port}"
        local = format_solutions(solve(str(tmp_path / "data"), small_onnx, quiet=True), as_json=True)
        assert format_solutions(solve(str(tmp_path / "data"), url=url, batch=8, quiet=True), as_json=True) == local
        text = ""
        end = time.monotonic() + 30
        while "ray_serve_num_http_requests_total" not in text and time.monotonic() < end:
            time.sleep(1)
            text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
        assert "ray_serve_num_http_requests_total" in text
        started = time.monotonic()
        os.kill(server.pid, signal.SIGTERM)
        rest = server.communicate(timeout=60)[1]
        assert server.returncode == 0 and "error" not in rest.lower() and "Traceback" not in rest, rest
        assert time.monotonic() - started < 30
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
    end = time.monotonic() + 10
    while ray_processes() and time.monotonic() < end:
        time.sleep(0.5)
    assert not ray_processes(), ray_processes()
