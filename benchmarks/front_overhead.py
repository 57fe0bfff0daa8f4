"""What the checking front of ``hrm-deploy serve`` adds to each request.

    python benchmarks/front_overhead.py [--requests 2000] [--batch 1] [--out benchmarks/results/front_overhead.json]

In process: a stand-in for tritonserver's HTTP endpoint (``http.server``, answers each POST at once
with a fixed body) and the front (:class:`hrm_deploy.serve.front.Front`, default capacity for max
batch 16) in front of it. One client on one kept-alive connection sends the same checked inference
request (the Sudoku shape: 81 tokens per puzzle, ``--batch`` puzzles, JSON data) ``--requests``
times straight to the stand-in, then through the front; the per-request difference (median and p99
of each) is the front's overhead: parsing, the checks, the hop through a worker thread and the
forward on a kept-alive upstream connection. The client shares the machine's cores with both.
``benchmarks/serve_load.py`` runs :func:`measure` too and sets it beside the recorded number of the
hand-written front this replaced (``benchmarks/results/front_overhead.json``, measured before aiohttp).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.serve.front import Front, Limits

_ANSWER = json.dumps({"outputs": [{"name": "answer", "datatype": "INT32", "shape": [1, 81], "data": [1] * 81}]})


class _Backend(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = -1  # head and body in one write (two small writes meet delayed ACKs: 40 ms a request)

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["Content-Length"]))
        data = _ANSWER.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _cpu_model() -> str:
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.is_file() else []
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.machine())


def _timings(port: int, body: bytes, n: int) -> np.ndarray:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = np.empty(n)
    for i in range(n + 50):  # 50 warm-up requests
        start = time.perf_counter()
        conn.request("POST", "/v2/models/hrm/infer", body=body, headers={"Content-Type": "application/json"})
        reply = conn.getresponse()
        reply.read()
        assert reply.status == 200, reply.status
        if i >= 50:
            out[i - 50] = time.perf_counter() - start
    conn.close()
    return out * 1e6


def measure(requests: int = 2000, batch: int = 1) -> dict[str, Any]:
    """The front's overhead per request: the same request straight to the stand-in and through the front."""
    backend = ThreadingHTTPServer(("127.0.0.1", 0), _Backend)
    threading.Thread(target=backend.serve_forever, daemon=True).start()
    tokens = np.random.default_rng(0).integers(0, 11, (batch, 81)).tolist()
    body = json.dumps(
        {
            "inputs": [
                {"name": "inputs", "shape": [batch, 81], "datatype": "INT32", "data": tokens},
                {"name": "puzzle_identifiers", "shape": [batch, 1], "datatype": "INT32", "data": [0] * batch},
            ]
        }
    ).encode()
    limits = Limits("hrm", 81, 16, bounds=(("inputs", 11), ("puzzle_identifiers", 1)))
    with Front("127.0.0.1", 0, backend.server_address[1], limits) as front:
        direct = _timings(backend.server_address[1], body, requests)
        through = _timings(front.listener.sock.getsockname()[1], body, requests)
    backend.shutdown()
    direct_us = {"p50": float(np.median(direct)), "p99": float(np.percentile(direct, 99))}
    front_us = {"p50": float(np.median(through)), "p99": float(np.percentile(through, 99))}
    return {
        "machine": f"{_cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average": os.getloadavg()[0],
        "requests": requests,
        "batch": batch,
        "body_bytes": len(body),
        "direct_us": direct_us,
        "front_us": front_us,
        "overhead_p50_us": front_us["p50"] - direct_us["p50"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = measure(args.requests, args.batch)
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
