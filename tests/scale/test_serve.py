"""``serve --ray``: Ray Serve replicas of the bundled step graph answer the project's own client with
``solve``'s answers, from distinct replicas; a replica killed under 16 concurrent clients loses no
request; past capacity a request gets 503 with ``Retry-After``; bad requests are one line; the model
deployment autoscales 1 -> 2 under load and back to 1 when idle. One local Ray for the module."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest

from hrm_deploy.scale.cluster import RayConfig
from hrm_deploy.serve.server import ServeConfig

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def step_graph(bundled_export, tmp_path_factory):
    """The bundled model's step graph and 48 of its held-out puzzles."""
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    folder = tmp_path_factory.mktemp("served")
    generate_sudoku(SudokuSpec(train=10, test=48, blanks=(10, 30), seed=78), str(folder / "data"))
    return bundled_export(mode="step"), folder / "data"


class Served:
    """``serve_on_ray`` running in a thread until :meth:`stop`."""

    def __init__(self, artifact, replicas, **options):
        from hrm_deploy.scale.serving import serve_on_ray

        self.port = free_port()
        config = ServeConfig(artifact, http_port=self.port, metrics_port=free_port(), grpc_port=free_port(), **options)
        self.url, self.stopped, self.lines = f"http://127.0.0.1:{self.port}", threading.Event(), []
        self.thread = threading.Thread(
            target=serve_on_ray,
            args=(config, RayConfig(), replicas),
            kwargs={"ready": self.lines.append, "stop": self.stopped},
        )
        self.thread.start()
        end = time.monotonic() + 120
        while not self.lines:
            assert self.thread.is_alive() and time.monotonic() < end, "serve_on_ray did not become ready"
            time.sleep(0.2)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(60)


def infer(url: str, tokens: np.ndarray, ids: np.ndarray) -> tuple[int, dict, Any]:
    """(status, JSON answer, headers) of one request in JSON form."""
    tokens, ids = np.asarray(tokens, np.int64), np.asarray(ids, np.int64)
    body = {
        "inputs": [
            {"name": "inputs", "datatype": "INT32", "shape": list(tokens.shape), "data": tokens.tolist()},
            {
                "name": "puzzle_identifiers",
                "datatype": "INT32",
                "shape": [len(ids), 1],
                "data": ids.reshape(-1, 1).tolist(),
            },
        ],
        "outputs": [{"name": "answer"}, {"name": "steps"}],
    }
    request = urllib.request.Request(f"{url}/v2/models/hrm/infer", data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read()), reply.headers  # case-insensitive
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), error.headers


@pytest.fixture(scope="class")
def two_replicas(ray_cluster, step_graph):
    """Two replicas of the step graph with --halt q, 4 slots and a queue of 4 each."""
    from hrm_deploy.scale.serving import Replicas

    graph, _ = step_graph
    served = Served(graph, Replicas(2), halt="q", max_batch=4, queue_limit=4)
    yield served
    served.stop()


class TestTwoReplicas:
    """One application of two replicas for these checks (stopped before the autoscaling one starts)."""

    def test_two_replicas_answer_the_projects_client_as_solve_does(self, two_replicas, step_graph):
        from hrm_deploy.solve import format_solutions, solve

        graph, data = step_graph
        local = format_solutions(solve(str(data), graph, "q", quiet=True), as_json=True)
        remote = format_solutions(solve(str(data), url=two_replicas.url, batch=4, quiet=True), as_json=True)
        assert remote == local
        tokens = np.ones((1, 81), np.int32)
        with cf.ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda _: infer(two_replicas.url, tokens, np.zeros(1)), range(32)))
        assert [status for status, _, _ in replies] == [200] * 32, [
            answer for status, answer, _ in replies if status != 200
        ]
        assert len({headers["hrm-replica"] for _, _, headers in replies}) == 2  # both replicas answered

    def test_a_replica_killed_under_16_clients_loses_no_request(self, two_replicas, step_graph):
        from hrm_deploy.data.examples import load_examples

        examples = load_examples(step_graph[1], None, split="test")
        expected = [infer(two_replicas.url, examples.inputs[i : i + 1], np.zeros(1, np.int64))[1] for i in range(16)]

        finish = threading.Event()

        def client(i: int) -> list:
            out = []
            while not finish.is_set():  # each client asks again and again while a replica dies
                status, answer, headers = infer(two_replicas.url, examples.inputs[i : i + 1], np.zeros(1, np.int64))
                while status == 503:  # past capacity while one replica is gone: told when to come back
                    time.sleep(float(headers.get("Retry-After", 1)))
                    status, answer, headers = infer(two_replicas.url, examples.inputs[i : i + 1], np.zeros(1, np.int64))
                out.append((status, answer))
            return out

        with cf.ThreadPoolExecutor(16) as pool:
            running = [pool.submit(client, i) for i in range(16)]
            time.sleep(1.0)
            pids = subprocess.run(
                ["pgrep", "-f", "ServeReplica:hrm:model"], capture_output=True, text=True
            ).stdout.split()
            assert len(pids) == 2
            os.kill(int(pids[0]), signal.SIGKILL)  # mid-load: requests of all 16 clients are in flight
            time.sleep(4.0)
            finish.set()
            results = [r.result(timeout=180) for r in running]
        assert all(len(answers) >= 2 for answers in results)  # every client kept being answered after the kill
        for i, answers in enumerate(results):
            assert all(status == 200 and answer == expected[i] for status, answer in answers), answers

    def test_past_capacity_is_503_with_retry_after_and_bad_requests_are_one_line(self, two_replicas):
        tokens = np.ones((4, 81), np.int32)
        with cf.ThreadPoolExecutor(64) as pool:
            statuses = list(pool.map(lambda _: infer(two_replicas.url, tokens, np.zeros(4)), range(64)))
        busy = [s for s in statuses if s[0] == 503]
        assert {s[0] for s in statuses} <= {200, 503} and busy, [s[0] for s in statuses]
        assert all(s[2].get("Retry-After") for s in busy)
        status, answer, _ = infer(two_replicas.url, np.full((1, 81), 99, np.int32), np.zeros(1))
        assert status == 400 and "outside the vocabulary" in answer["error"] and "\n" not in answer["error"]
        request = urllib.request.Request(f"{two_replicas.url}/v2/models/other/infer", data=b"{}")
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request, timeout=30)
        assert error.value.code == 404 and "unknown model" in json.loads(error.value.read())["error"]


def test_autoscaling_adds_a_replica_under_load_and_removes_it_when_idle(ray_cluster, step_graph):
    from ray import serve

    from hrm_deploy.scale.serving import Replicas

    graph, _ = step_graph
    scaling = Replicas(autoscale=(1, 2), target=1, upscale_delay_s=0.5, downscale_delay_s=2.0)
    served = Served(graph, scaling, halt="off", max_batch=2, queue_limit=8)

    def running() -> int:
        states = serve.status().applications["hrm"].deployments["model"].replica_states
        return int(states.get("RUNNING", 0))

    try:
        assert running() == 1
        load = threading.Event()

        def client() -> None:
            while not load.is_set():
                infer(served.url, np.ones((2, 81), np.int32), np.zeros(2))

        with cf.ThreadPoolExecutor(8) as pool:
            for _ in range(8):
                pool.submit(client)
            # a second replica loads the artifact in a fresh worker process: on a loaded 2-core
            # machine (the whole suite beside it) that alone can take tens of seconds
            end = time.monotonic() + 150
            while running() < 2 and time.monotonic() < end:
                time.sleep(0.5)
            load.set()
        assert running() == 2
        end = time.monotonic() + 90
        while running() > 1 and time.monotonic() < end:
            time.sleep(0.5)
        assert running() == 1
    finally:
        served.stop()
