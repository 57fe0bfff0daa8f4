"""In-flight batching inside Triton vs ``hrm-deploy serve``'s in-flight vs dynamic batching, under load,
with early halting on, and the per-request overhead of serve's checking front.

    python benchmarks/serve_load.py [--models bundled,sudoku-size] [--clients 1,8,32]
        [--modes inflight,triton-inflight,dynamic] [--duration 20] [--max-batch 32]
        [--rates 0.25,0.5,0.75,0.9,1.1] [--smoke]

Models (step graphs, ONNX Runtime CPU unless --provider says otherwise):

- ``bundled``: the bundled sudoku-small checkpoint (8 ACT steps), ``--halt q``;
- ``sudoku-size``: the Sudoku-size architecture (hidden 512, 4 H + 4 L layers, 2 x 2 cycles,
  16 ACT steps; ``benchmarks/sudoku_size.py``) with random weights and a random Q head, halting at
  ``threshold:X`` with X the 90th percentile of sigmoid(q_halt) over all steps of 32 puzzles, so
  the step count varies from puzzle to puzzle (its distribution is in the results).

For each model and each mode, one server (free loopback ports) is started, warmed up, and driven by
(modes: ``inflight`` and ``dynamic`` are ``hrm-deploy serve --batching inflight|dynamic``;
``triton-inflight`` is a ``triton-repo`` repository of the same step graph and rule, its in-flight ACT
driver and the step model on ONNX Runtime inside the Python backend, served by PyTriton's bundled
``tritonserver --model-repository REPO`` started directly: no front, Triton's HTTP endpoint)

1. closed-loop HTTP clients (threads with one persistent ``tritonclient`` connection each, one
   puzzle per request, for ``--duration`` seconds) at each count in ``--clients``: puzzles/s,
   p50/p99 and the worst latency;
2. an open-loop Poisson arrival process at fixed rates (``--rates`` x the best closed-loop
   puzzles/s of the two modes at the largest client count): p50/p99 latency from each request's
   scheduled arrival, achieved puzzles/s, refused (HTTP 503) requests.

Then the front's overhead per request (``front_overhead.py``'s :func:`measure`: the same checked request
to a stand-in backend straight and through the front), set beside the recorded number of the
hand-written front it replaced (``benchmarks/results/front_overhead.json``).

Writes ``benchmarks/results/serve_load.json`` and ``serve_load.png`` (latency vs offered load, every
mode). ``--smoke``: 3 s per point, two open-loop rates, 200 front requests, bundled model only unless
--models is given (proves the script runs; not a measurement). Run it in the serve venv (README,
Serving) on an idle machine.
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from front_overhead import measure as front_overhead
from load_common import (
    SUDOKU_SIZE_BLANKS,
    bundled_puzzles,
    closed_loop,
    spread_threshold,
    step_graph,
    sudoku_puzzles,
    sudoku_size_checkpoint,
    summary,
)


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


# ------------------------------------------------------------------------------------ models
def bundled(work: Path) -> tuple[Path, str, np.ndarray]:
    from hrm_deploy.cli.common import bundled_checkpoint

    return step_graph(bundled_checkpoint("sudoku-small"), work / "bundled.step.onnx"), "q", bundled_puzzles()


def sudoku_size(work: Path) -> tuple[Path, str, np.ndarray]:
    from hrm_deploy.backends import open_runner

    onnx = step_graph(sudoku_size_checkpoint(work), work / "sudoku-size.step.onnx")
    tokens = sudoku_puzzles(SUDOKU_SIZE_BLANKS)
    with open_runner(onnx) as runner:  # all 16 steps of 32 puzzles: where to cut sigmoid(q_halt)
        return onnx, spread_threshold(runner, tokens), tokens


MODELS = {"bundled": bundled, "sudoku-size": sudoku_size}


# ------------------------------------------------------------------------------------ server
class Server:
    def __init__(self, artifact: Path, halt: str, batching: str, max_batch: int, log: Path, provider: str | None):
        self.http, grpc, metrics = free_ports(3)
        cmd = [sys.executable, "-m", "hrm_deploy", "serve", str(artifact), "--halt", halt, "--batching", batching]
        cmd += ["--http-port", str(self.http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
        cmd += ["--max-batch", str(max_batch), "--queue-limit", str(max(8 * max_batch, 1024))]
        cmd += ["--provider", provider] if provider else []
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        wait_ready(self.http, self.proc, log, self.stop)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=120)


class TritonRepoServer:
    """A ``triton-repo`` repository (in-flight ACT driver, ``--onnx-backend python``) on PyTriton's
    bundled tritonserver started directly, model ``hrm``."""

    def __init__(self, artifact: Path, halt: str, max_batch: int, work: Path):
        from hrm_deploy.serve.binding import bundled_tritonserver
        from hrm_deploy.serve.repo import OnnxBackend, RepoConfig, write_triton_repo

        repo = work / f"{artifact.stem}.repo"
        config = RepoConfig(output=repo, halt=halt, onnx_backend=OnnxBackend.python, names=("hrm",))
        write_triton_repo([artifact], replace(config, max_batch=max_batch, overwrite=True))
        self.http, grpc, metrics = free_ports(3)
        cmd, env = bundled_tritonserver(repo, work, http_port=self.http, grpc_port=grpc, metrics_port=metrics)
        self.log = work / f"{artifact.stem}.triton.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        wait_ready(self.http, self.proc, self.log, self.stop)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=120)


def wait_ready(port: int, proc: subprocess.Popen, log: Path, stop: Any) -> None:
    import tritonclient.http as httpclient

    deadline = time.monotonic() + 300
    while True:
        with contextlib.suppress(Exception):  # not up yet
            if httpclient.InferenceServerClient(f"127.0.0.1:{port}").is_model_ready("hrm"):
                return
        if proc.poll() is not None or time.monotonic() > deadline:
            stop()
            raise SystemExit(f"server did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.5)


class Clients:
    """One tritonclient HTTP connection per thread; ``call(i)`` sends puzzle i, returns (ok, steps)."""

    def __init__(self, port: int, tokens: np.ndarray):
        self.port, self.tokens, self.local = port, tokens, threading.local()

    def call(self, i: int) -> tuple[bool, int]:
        import tritonclient.http as httpclient

        if not hasattr(self.local, "client"):
            self.local.client = httpclient.InferenceServerClient(f"127.0.0.1:{self.port}", network_timeout=600)
        row = self.tokens[i % len(self.tokens)][None]
        inputs = [
            httpclient.InferInput("inputs", list(row.shape), "INT32"),
            httpclient.InferInput("puzzle_identifiers", [1, 1], "INT32"),
        ]
        inputs[0].set_data_from_numpy(row)
        inputs[1].set_data_from_numpy(np.zeros((1, 1), np.int32))
        wanted = [httpclient.InferRequestedOutput(n) for n in ("answer", "steps")]
        try:
            result = self.local.client.infer("hrm", inputs, outputs=wanted)
        except Exception:  # noqa: BLE001 - counted (503 refusals under overload, errors)
            return False, 0
        return True, int(result.as_numpy("steps").reshape(-1)[0])


def open_loop(clients: Clients, rate: float, duration: float, seed: int = 0) -> dict:
    """Poisson arrivals at ``rate`` puzzles/s for ``duration`` s; latency from the scheduled arrival."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, int(rate * duration * 1.5) + 10))
    arrivals = arrivals[arrivals < duration]
    latencies: list[float] = []
    steps: list[int] = []
    failed = [0]
    lock = threading.Lock()
    start = time.perf_counter()

    def one(k: int) -> None:
        ok, used = clients.call(k)
        with lock:
            if ok:
                latencies.append(time.perf_counter() - (start + arrivals[k]))
                steps.append(used)
            else:
                failed[0] += 1

    with ThreadPoolExecutor(512) as pool:
        for k, at in enumerate(arrivals):
            delay = start + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            pool.submit(one, k)
    out = summary(latencies, time.perf_counter() - start, len(latencies), failed[0], steps)
    out["offered_per_s"] = rate
    return out


def gauges(port: int) -> dict[str, float]:
    with contextlib.suppress(Exception):
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        return {m[1]: float(m[2]) for m in re.finditer(r'^hrm_inflight_(\w+)\{model="hrm"\} (\S+)$', text, re.M)}
    return {}


# ------------------------------------------------------------------------------------ the run
def measure_mode(artifact, halt, tokens, mode, args, work) -> dict:
    server: Server | TritonRepoServer
    if mode == "triton-inflight":
        server = TritonRepoServer(artifact, halt, args.max_batch, work)
    else:
        server = Server(artifact, halt, mode, args.max_batch, work / f"{artifact.stem}.{mode}.log", args.provider)
    try:
        clients = Clients(server.http, tokens)
        closed_loop(clients.call, min(8, max(args.clients)), min(3.0, args.duration))  # warm-up
        rows = {}
        for n in args.clients:
            before = gauges(server.http)
            rows[str(n)] = closed_loop(clients.call, n, args.duration)
            after = gauges(server.http)
            if after:  # in-flight: mean busy slots per step call over this point
                answered = after["puzzles_answered_total"] - before["puzzles_answered_total"]
                calls = after["step_calls_total"] - before["step_calls_total"]
                rows[str(n)]["rows_per_step"] = answered * (rows[str(n)]["mean_steps"] or 0) / max(calls, 1)
            print(f"  {mode:15s} {n:>4} clients: {fmt(rows[str(n)])}", flush=True)
        return {"closed_loop": rows, "gauges": gauges(server.http), "server": server, "clients": clients}
    except BaseException:
        server.stop()
        raise


def fmt(r: dict) -> str:
    return (
        f"{r['puzzles_per_s']:8.1f} puzzles/s  p50 {r['p50_ms']:8.1f} ms  p99 {r['p99_ms']:8.1f} ms  "
        f"worst {r['worst_ms']:8.1f} ms  failed {r['failed']}"
    )


def run_model(name: str, args, work: Path) -> dict:
    artifact, halt, tokens = MODELS[name](work)
    print(f"{name}: {artifact.name}, --halt {halt}", flush=True)
    modes = {m: measure_mode(artifact, halt, tokens, m, args, work) for m in args.modes}
    top = str(max(args.clients))
    peak = max(m["closed_loop"][top]["puzzles_per_s"] for m in modes.values())
    result: dict = {"artifact": artifact.name, "halt": halt, "modes": {}}
    try:
        for mode, m in modes.items():  # the open loop, both servers still up (one busy at a time)
            curve = []
            for fraction in args.rates:
                curve.append(open_loop(m["clients"], peak * fraction, args.duration))
                print(f"  {mode:15s} open loop {peak * fraction:7.1f}/s offered: {fmt(curve[-1])}", flush=True)
            result["modes"][mode] = {
                "closed_loop": m["closed_loop"],
                "open_loop": curve,
                "inflight_gauges": m["gauges"],
            }
    finally:
        for m in modes.values():
            m["server"].stop()
    c = {mode: result["modes"][mode]["closed_loop"] for mode in modes}
    for a, b in (("inflight", "dynamic"), ("triton-inflight", "dynamic"), ("triton-inflight", "inflight")):
        if a in c and b in c and "32" in c[a] and "32" in c[b]:
            result[f"{a}/{b}_puzzles_per_s_at_32_clients"] = c[a]["32"]["puzzles_per_s"] / c[b]["32"]["puzzles_per_s"]
            result[f"{a}/{b}_p99_at_32_clients"] = c[a]["32"]["p99_ms"] / c[b]["32"]["p99_ms"]
    return result


def plot(results: dict, path: Path, smoke: bool = False) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), squeeze=False)
    for ax, (name, res) in zip(axes[0], results.items()):
        for mode, color, marker in (("inflight", "C0", "o"), ("triton-inflight", "C2", "^"), ("dynamic", "C3", "s")):
            if mode not in res["modes"]:
                continue
            curve = res["modes"][mode]["open_loop"]
            x = [p["offered_per_s"] for p in curve]
            ax.plot(x, [p["p50_ms"] for p in curve], "-", marker=marker, color=color, label=f"{mode} p50")
            ax.plot(x, [p["p99_ms"] for p in curve], ":", marker=marker, color=color, alpha=0.6, label=f"{mode} p99")
        ax.set(title=f"{name} ({res['halt']})", xlabel="offered load (puzzles/s, Poisson)", ylabel="latency (ms)")
        ax.set_yscale("log")
        ax.legend()
    if smoke:
        fig.suptitle("smoke run (3 s points): proves the script, not a measurement")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=None, help="bundled,sudoku-size (default both; --smoke: bundled)")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--modes", default="inflight,triton-inflight,dynamic")
    parser.add_argument("--front-requests", type=int, default=2000, help="requests of the front-overhead measurement")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per measurement point")
    parser.add_argument("--rates", default="0.25,0.5,0.75,0.9,1.1", help="open loop: fractions of the peak")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--provider", default=None, help="ONNX Runtime provider (cpu, cuda)")
    parser.add_argument("--smoke", action="store_true", help="3 s per point: proves the script runs")
    parser.add_argument("--out", default="benchmarks/results/serve_load.json")
    args = parser.parse_args()
    args.clients = [int(c) for c in args.clients.split(",")]
    args.rates = [float(r) for r in args.rates.split(",")]
    args.modes = args.modes.split(",")
    if args.provider not in (None, "cpu") and "triton-inflight" in args.modes:
        # the repository's step model runs ONNX Runtime CPU inside the Python backend (PyTriton's server has
        # no other backend): next to a GPU serve it would measure the device, not the scheduling
        print("--provider: triton-inflight runs on the CPU here; left out of this run", flush=True)
        args.modes.remove("triton-inflight")
    if args.smoke:
        args.duration, args.rates, args.front_requests = 3.0, args.rates[1::3], 200
    names = (args.models or ("bundled" if args.smoke else "bundled,sudoku-size")).split(",")
    with tempfile.TemporaryDirectory() as tmp:
        results = {name: run_model(name, args, Path(tmp)) for name in names}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    plot(results, png, args.smoke)
    recorded = Path(__file__).resolve().parent / "results" / "front_overhead.json"
    report = {
        "what": "in-flight inside Triton (triton-repo on stock tritonserver) vs hrm-deploy serve in-flight vs dynamic "
        "batching, early halting on, HTTP, one puzzle per request; the front's overhead per request",
        "smoke": args.smoke,
        "duration_s_per_point": args.duration,
        "max_batch": args.max_batch,
        "provider": args.provider or "cpu",
        "clients": "threads in this process, one persistent tritonclient HTTP connection each",
        "goal": "triton-inflight within 10% of serve's in-flight puzzles/s at 32 clients, and >= 1.3x dynamic",
        "models": results,
        "front_overhead": {
            "before_hand_written_front": json.loads(recorded.read_text()) if recorded.is_file() else None,
            "after_aiohttp_front": front_overhead(args.front_requests),
        },
        "plot": png.name,
        "host": {
            "cpus": os.cpu_count(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "loadavg_at_end": os.getloadavg(),
        },
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out} and {png}")


if __name__ == "__main__":
    main()
