"""Served vs in-process throughput and latency of the bundled sudoku-tiny model (ONNX, CPU).

    python benchmarks/serve_load.py [--requests 256] [--clients 1,8,32] [--max-batch 32]

Starts ``hrm-deploy serve`` (PyTriton's tritonserver, dynamic batching) on free loopback ports
and drives it with C concurrent closed-loop clients (threads, one persistent HTTP connection
each, one puzzle per request) for C in --clients; then, in the same run with the server idle,
the in-process ONNX Runtime runner on batches of C puzzles (the largest batch C single-puzzle
clients can give Triton). Throughput is puzzles/s; latency per request (served) or per batch
call (in-process), p50/p99. The batch sizes Triton formed come from its Prometheus metrics.
Run it in the serve venv (README, Serving). Writes benchmarks/results/serve_load.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def metrics(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        k: float(re.search(rf'^{k}{{model="hrm".*}} (\S+)$', text, re.MULTILINE).group(1))
        for k in ("nv_inference_request_success", "nv_inference_exec_count")
    }


def stats(latencies: list[float], wall: float, puzzles: int) -> dict[str, float]:
    lat = np.asarray(latencies) * 1e3
    return {
        "puzzles_per_s": puzzles / wall,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "wall_s": wall,
        "puzzles": puzzles,
    }


def served(port: int, metrics_port: int, tokens: np.ndarray, ids: np.ndarray, clients: int, requests: int) -> dict:
    import tritonclient.http as httpclient

    per_client = max(1, requests // clients)
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)

    def run(c: int) -> None:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
        mine = []
        barrier.wait()
        for j in range(per_client):
            i = (c * per_client + j) % len(tokens)
            inputs = [
                httpclient.InferInput("inputs", [1, tokens.shape[1]], "INT32"),
                httpclient.InferInput("puzzle_identifiers", [1, 1], "INT32"),
            ]
            inputs[0].set_data_from_numpy(tokens[i : i + 1])
            inputs[1].set_data_from_numpy(ids[i : i + 1].reshape(1, 1))
            t0 = time.perf_counter()
            try:
                client.infer("hrm", inputs, outputs=[httpclient.InferRequestedOutput("answer")])
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors.append(str(exc)[:200])
            mine.append(time.perf_counter() - t0)
        client.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=run, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    before = metrics(metrics_port)
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    after = metrics(metrics_port)
    out = stats(latencies, wall, clients * per_client)
    execs = after["nv_inference_exec_count"] - before["nv_inference_exec_count"]
    out["mean_batch_formed"] = (after["nv_inference_request_success"] - before["nv_inference_request_success"]) / max(
        execs, 1
    )
    out["errors"] = len(errors)
    return out


def in_process(runner, tokens: np.ndarray, ids: np.ndarray, batch: int, requests: int) -> dict:
    calls = max(1, requests // batch)
    latencies = []
    start = time.perf_counter()
    for k in range(calls):
        i = (k * batch) % (len(tokens) - batch + 1)
        t0 = time.perf_counter()
        runner.infer({"inputs": tokens[i : i + batch], "puzzle_identifiers": ids[i : i + batch]})
        latencies.append(time.perf_counter() - t0)
    return stats(latencies, time.perf_counter() - start, calls * batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=256, help="puzzles per measurement")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--out", default="benchmarks/results/serve_load.json")
    args = parser.parse_args()
    client_counts = [int(c) for c in args.clients.split(",")]

    from hrm_deploy.backends import open_runner
    from hrm_deploy.cli.common import bundled_checkpoint
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.train.presets import preset

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        onnx = export_onnx(bundled_checkpoint(), work / "sudoku-tiny.onnx", ExportConfig(parity=False), quiet=True).path
        split = generate_sudoku(SudokuSpec(train=0, test=256, blanks=preset("sudoku-tiny")["data"]["blanks"], seed=7))[
            "test"
        ]
        tokens = np.ascontiguousarray(split.inputs, dtype=np.int32)
        ids = np.zeros(len(tokens), np.int32)

        http, grpc, mport = free_ports(3)
        log = (work / "serve.log").open("w")
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hrm_deploy",
                "serve",
                str(onnx),
                "--http-port",
                str(http),
                "--grpc-port",
                str(grpc),
                "--metrics-port",
                str(mport),
                "--max-batch",
                str(args.max_batch),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            import tritonclient.http as httpclient

            deadline = time.monotonic() + 180
            while True:
                with contextlib.suppress(Exception):  # not up yet
                    if httpclient.InferenceServerClient(f"127.0.0.1:{http}").is_model_ready("hrm"):
                        break
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"server did not start:\n{(work / 'serve.log').read_text()[-2000:]}")
                time.sleep(0.5)
            served(http, mport, tokens, ids, 8, 64)  # warm-up
            results_served = {c: served(http, mport, tokens, ids, c, args.requests) for c in client_counts}
        finally:
            server.terminate()
            server.wait(timeout=60)
        runner = open_runner(onnx)
        runner.activate()
        in_process(runner, tokens, ids, 8, 64)  # warm-up
        results_local = {c: in_process(runner, tokens, ids, c, args.requests) for c in client_counts}
        runner.close()

    rows = {}
    for c in client_counts:
        s, p = results_served[c], results_local[c]
        rows[str(c)] = {
            "served": s,
            "in_process_same_batch": p,
            "served_over_in_process": s["puzzles_per_s"] / p["puzzles_per_s"],
        }
    report = {
        "model": "bundled sudoku-tiny, ONNX FP32 (unrolled), ONNX Runtime CPU",
        "server": f"hrm-deploy serve (PyTriton tritonserver, dynamic batching, max batch {args.max_batch}, "
        "queue delay 2000 us), HTTP, clients = threads in this process with persistent connections",
        "goal": "served >= 0.8 x in-process puzzles/s at 32 clients",
        "goal_met": rows[str(client_counts[-1])]["served_over_in_process"] >= 0.8,
        "clients": rows,
        "host": {
            "cpus": os.cpu_count(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "loadavg_at_end": os.getloadavg(),
            "nproc_busy_note": "other helpers and a training job share these 2 cores",
        },
        "note": "2-core CPU shared with other jobs (nice'd); compare ratios within this run only",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for c, r in rows.items():
        print(
            f"{c:>3} clients: served {r['served']['puzzles_per_s']:8.1f}/s p50 {r['served']['p50_ms']:6.1f} ms "
            f"p99 {r['served']['p99_ms']:6.1f} ms (batch {r['served']['mean_batch_formed']:.1f}) | in-process "
            f"{r['in_process_same_batch']['puzzles_per_s']:8.1f}/s | ratio {r['served_over_in_process']:.2f}"
        )


if __name__ == "__main__":
    main()
