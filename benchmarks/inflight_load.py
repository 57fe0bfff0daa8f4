"""In-flight batching vs a Triton-like dynamic batcher, in process: the scheduling effect alone.

    python benchmarks/inflight_load.py [--artifact PATH | --sudoku-size] [--device cuda|cpu]
        [--step-graph] [--halt q] [--clients 1,8,32,128] [--duration 10] [--max-batch 32]
        [--max-queue-delay-us 2000] [--seed 7] [--out benchmarks/results/inflight_load.json] [--smoke]

One runner (``hrm_deploy.backends.open_runner``) on the artifact, two ways of sharing it between
closed-loop client threads that each send one puzzle at a time and wait for its answer:

- **inflight**: ``hrm-deploy serve``'s :class:`~hrm_deploy.serve.inflight.InflightScheduler` over
  the runner's step function (``slots`` = ``--max-batch``, a queue that never refuses), the one serve
  picks (``hrm_deploy.serve.server.inflight_step``); a runner without one is skipped with one line;
- **dynamic**: a batcher thread that does what Triton's dynamic batcher does for ``serve
  --batching dynamic`` (one model instance, no preferred sizes, so the preferred batch is the max
  batch): it sends a batch as soon as ``--max-batch`` requests are queued, or when the oldest one
  has waited ``--max-queue-delay-us`` (serve's default), runs ``runner.infer(batch, halt=...)``
  (each batch runs until its slowest puzzle halts) and answers each request.

Per client count and mode: puzzles/s, p50/p99/worst latency (submit to answer), mean ACT steps per
answer, rows per step call (inflight) or mean batch (dynamic), and the inflight/dynamic ratios.
Both modes are warmed up first (first CUDA calls, every batch size) and measured point by point, interleaved, on the
same puzzles (the project's Sudoku generator, ``--seed``). Correctness: a sample of each mode's
answers (``--check`` per point) is compared with ``runner.infer`` of that puzzle alone under the
same halting rule: argmax and steps must be equal (mismatches are counted), the logits' largest
absolute difference is recorded.

Artifacts: the bundled checkpoint (default), any artifact ``open_runner`` opens (``--device`` goes to
checkpoints as a torch device and to engines as a GPU index; ``--provider`` to ONNX graphs),
``--step-graph`` (measure the artifact's ONNX step graph, exported to a temporary folder, on ONNX
Runtime) and ``--sudoku-size`` (the random-weight Sudoku-size checkpoint of ``sudoku_size.py``
halting at ``threshold:X`` as ``serve_load.py`` picks it, so its step counts vary).

What it does not measure: HTTP, Triton or the checking front (``serve_load.py`` does, and needs
PyTriton); clients are threads of this process, so at high counts the GIL is part of the picture
for both modes alike. Writes ``--out`` (rewritten after every point) and prints a markdown table.
``--smoke``: 1 s per point, clients 1,8 (proves the script runs; not a measurement).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
from load_common import (
    PUZZLE_SEED,
    PUZZLES,
    SUDOKU_SIZE_BLANKS,
    closed_loop,
    spread_threshold,
    step_graph,
    sudoku_puzzles,
    sudoku_size_checkpoint,
)

WAIT_S = 600.0  # a request that takes longer is a failure, not a hang


class DynamicBatcher:
    """Triton's dynamic batcher with one model instance: a thread forms a batch of up to
    ``max_batch`` queued requests once that many are queued or the oldest has waited ``delay_s``,
    runs it through ``runner.infer`` to its end and answers each request. ``batches`` lists the
    batch sizes it ran."""

    def __init__(self, runner: Any, halt: Any, max_batch: int, delay_s: float):
        self.runner, self.halt, self.max_batch, self.delay_s = runner, halt, max_batch, delay_s
        self._cond = threading.Condition()
        self._queue: deque[dict[str, Any]] = deque()
        self._stopping = False
        self.batches: list[int] = []
        self.thread = threading.Thread(target=self._run, name="dynamic-batcher", daemon=True)
        self.thread.start()

    def submit(self, tokens: np.ndarray) -> dict[str, Any]:
        """Queue one puzzle (int32 [S]); wait on the returned request's ``done`` event."""
        request = {"tokens": tokens, "arrived": time.monotonic(), "done": threading.Event(), "out": None}
        with self._cond:
            self._queue.append(request)
            self._cond.notify()
        return request

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self.thread.join(timeout=60)

    def _next_batch(self) -> list[dict[str, Any]] | None:
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            # a full batch goes at once; otherwise the oldest request's delay decides
            while not self._stopping and len(self._queue) < self.max_batch:
                left = self._queue[0]["arrived"] + self.delay_s - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if self._stopping:
                return None
            return [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]

    def _run(self) -> None:
        while (batch := self._next_batch()) is not None:
            feeds = {
                "inputs": np.stack([r["tokens"] for r in batch]),
                "puzzle_identifiers": np.zeros(len(batch), np.int32),
            }
            try:
                out = self.runner.infer(feeds, halt=self.halt)
            except Exception:  # noqa: BLE001 - every request of the batch fails, as in Triton
                logging.getLogger(__name__).exception("dynamic batch of %d failed", len(batch))
                out = None
            self.batches.append(len(batch))
            for k, request in enumerate(batch):
                if out is not None:
                    request["out"] = (out["logits"][k], int(out["steps_used"][k]))
                request["done"].set()


class Mode:
    """One way of serving the clients: ``call(i)`` answers puzzle i (the closed loop's callable)
    and keeps up to ``check`` answers per point as (puzzle, logits, steps) for the correctness check."""

    def __init__(self, name: str, answer: Any, tokens: np.ndarray, check: int):
        self.name, self.answer, self.tokens, self.check = name, answer, tokens, check
        self.kept: list[tuple[int, np.ndarray, int]] = []
        self._kept_this_point = 0
        self._lock = threading.Lock()

    def new_point(self) -> None:
        self._kept_this_point = 0

    def call(self, i: int) -> tuple[bool, int]:
        index = i % len(self.tokens)
        result = self.answer(self.tokens[index])
        if result is None:
            return False, 0
        logits, steps = result
        with self._lock:
            if self._kept_this_point < self.check:
                self._kept_this_point += 1
                self.kept.append((index, np.array(logits, np.float32), steps))
        return True, steps


def inflight_answer(scheduler: Any) -> Any:
    def answer(tokens: np.ndarray) -> tuple[np.ndarray, int] | None:
        ticket = scheduler.submit(tokens[None], np.zeros(1, np.int32))
        if not ticket.wait(WAIT_S) or ticket.error:
            return None
        out = ticket.outputs()
        return out["logits"][0], int(out["steps_used"][0])

    return answer


def dynamic_answer(batcher: DynamicBatcher) -> Any:
    def answer(tokens: np.ndarray) -> tuple[np.ndarray, int] | None:
        request = batcher.submit(tokens)
        return request["out"] if request["done"].wait(WAIT_S) else None

    return answer


def check_answers(runner: Any, halt: Any, tokens: np.ndarray, kept: list[tuple[int, np.ndarray, int]]) -> dict:
    """Each kept answer against ``runner.infer`` of its puzzle alone: argmax and steps exactly."""
    mismatches, worst = [], 0.0
    for index, logits, steps in kept:
        alone = runner.infer(
            {"inputs": tokens[index : index + 1], "puzzle_identifiers": np.zeros(1, np.int32)}, halt=halt
        )
        ref_logits, ref_steps = np.asarray(alone["logits"][0], np.float32), int(alone["steps_used"][0])
        worst = max(worst, float(np.max(np.abs(logits - ref_logits))))
        differ = logits.argmax(-1) != ref_logits.argmax(-1)  # [S]
        if differ.any() or steps != ref_steps:
            top2 = np.sort(ref_logits[differ], -1)[:, -2:]  # a near-tie flips on rounding alone
            margin = float(np.min(top2[:, 1] - top2[:, 0])) if differ.any() else None
            mismatches.append(
                {"puzzle": index, "cells_differ": int(differ.sum()), "smallest_top2_margin": margin}
                | {"steps": steps, "steps_alone": ref_steps}
            )
    return {"checked": len(kept), "mismatches": len(mismatches), "max_abs_logit_diff": worst, "first": mismatches[:5]}


# ------------------------------------------------------------------------------------ setup
def from_bundled(artifact: Path, bundled: Path) -> bool:
    """Whether ``artifact`` is the bundled checkpoint or was made from it (its manifest's checkpoint
    hash): then its puzzles are the bundled preset's, else Sudoku-size ones."""
    from hrm_deploy.io import sha256_file
    from hrm_deploy.manifest import manifest_path, read_manifest

    if artifact.resolve() == bundled.resolve():
        return True
    if not manifest_path(artifact).is_file():
        return False
    source = (read_manifest(artifact).get("checkpoint") or {}).get("sha256")
    return source is not None and source == sha256_file(bundled)


def prepare(args: argparse.Namespace, work: Path) -> tuple[Path, np.ndarray, str]:
    """(the artifact to run, its puzzles, what it is)."""
    from hrm_deploy.runtime.artifact import read_contract
    from hrm_deploy.train.presets import bundled_checkpoint, preset

    if args.sudoku_size:
        artifact, blanks, label = sudoku_size_checkpoint(work), SUDOKU_SIZE_BLANKS, "sudoku-size (random weights)"
    else:
        artifact = Path(args.artifact or bundled_checkpoint("sudoku-small"))
        bundled = from_bundled(artifact, Path(bundled_checkpoint("sudoku-small")))
        blanks = tuple(preset("sudoku-small")["data"]["blanks"]) if bundled else SUDOKU_SIZE_BLANKS
        label = "bundled sudoku-small" if bundled else artifact.name
    seq_len = read_contract(artifact).seq_len
    if seq_len != 81:
        raise SystemExit(f"{artifact.name} takes sequences of {seq_len} tokens; this benchmark sends 9x9 Sudoku (81)")
    if args.step_graph:
        artifact, label = step_graph(artifact, work / f"{artifact.stem}.step.onnx"), f"{label}, ONNX step graph"
    return artifact, sudoku_puzzles(blanks, args.puzzles, args.seed), label


def open_options(artifact: Path, device: str, provider: str | None) -> dict[str, Any]:
    """Runner options: ``provider`` where the backend takes one (registry), ``device`` as a torch
    device for a checkpoint and as a GPU index for an engine."""
    from hrm_deploy.registry import BACKENDS, runner_name, runner_options

    options = runner_options(artifact, provider=provider)
    kind = BACKENDS[runner_name(artifact)].kind
    if kind == "checkpoint":
        options["device"] = device
    elif kind in ("engine", "pt2") and device.startswith("cuda"):
        options["device"] = int(device.partition(":")[2] or 0)
    return options


def pick_step(runner: Any, artifact: Path, halt_text: str, halt: Any) -> tuple[Any, str | None]:
    """(serve's in-flight step function, None) or (None, why in-flight cannot run)."""
    from hrm_deploy.errors import ConfigError
    from hrm_deploy.runtime.artifact import read_contract
    from hrm_deploy.serve.server import Batching, ServeConfig, inflight_step

    config = ServeConfig(artifact=artifact, halt=halt_text, batching=Batching.inflight)
    try:
        return inflight_step(runner, read_contract(artifact).manifest, config, halt), None
    except ConfigError as exc:
        return None, str(exc)


def machine(device: str) -> dict[str, Any]:
    from hrm_deploy.backends.ort.builder.isa import isa_flags
    from hrm_deploy.bench.profile import cpu_description

    try:
        import torch
    except ImportError:  # an ONNX graph on ORT needs no torch
        torch = None  # type: ignore[assignment]
    cuda = torch is not None and device.startswith("cuda") and torch.cuda.is_available()
    return {
        "cpu": cpu_description(),
        "isa": isa_flags(),
        "cpus": os.cpu_count(),
        "gpu": torch.cuda.get_device_name(torch.device(device)) if cuda else None,
        "torch": torch.__version__ if torch is not None else None,
        "python": platform.python_version(),
        "load_average_start": os.getloadavg(),
    }


# ------------------------------------------------------------------------------------ the run
def fmt(r: dict) -> str:
    return (
        f"{r['puzzles_per_s']:8.1f} puzzles/s  p50 {r['p50_ms']:8.1f} ms  p99 {r['p99_ms']:8.1f} ms  "
        f"worst {r['worst_ms']:8.1f} ms  steps {r['mean_steps'] or 0:.2f}  failed {r['failed']}"
    )


def measure(modes: dict[str, Mode], probes: dict[str, Any], args: argparse.Namespace, report: dict, out: Path):
    """Warm up each mode, then each client count, modes interleaved; ``report`` rewritten per point."""
    for mode in modes.values():  # every bucket up to the max batch (first CUDA calls and compiles per shape)
        clients = 1
        while clients < min(max(args.clients), args.max_batch):
            closed_loop(mode.call, clients, min(0.3, args.duration))
            clients *= 2
        closed_loop(mode.call, min(max(args.clients), args.max_batch), min(2.0, args.duration))
        mode.kept.clear()
    for n in args.clients:
        for name, mode in modes.items():
            mode.new_point()
            before = probes[name]()
            row = closed_loop(mode.call, n, args.duration)
            after = probes[name]()
            if name == "inflight":  # busy slots per step call over the point
                calls = after["step_calls_total"] - before["step_calls_total"]
                row["rows_per_step"] = row["answered"] * (row["mean_steps"] or 0) / max(calls, 1)
            else:
                formed = after[len(before) :]
                row["mean_batch"] = float(np.mean(formed)) if formed else None
            report["modes"][name][str(n)] = row
            print(f"  {name:8s} {n:>4} clients: {fmt(row)}", flush=True)
            ratios(report)
            write(out, report)


def ratios(report: dict) -> None:
    inflight, dynamic = report["modes"].get("inflight", {}), report["modes"]["dynamic"]
    report["inflight_over_dynamic"] = {
        n: {
            "puzzles_per_s": inflight[n]["puzzles_per_s"] / max(dynamic[n]["puzzles_per_s"], 1e-9),
            "p99": inflight[n]["p99_ms"] / dynamic[n]["p99_ms"],
        }
        for n in inflight
        if n in dynamic
    }


def write(out: Path, report: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(out)


def table(report: dict) -> str:
    lines = [
        "| clients | mode | puzzles/s | p50 ms | p99 ms | worst ms | steps/answer | rows/step or batch | x dynamic |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in report["clients"]:
        for name, rows in report["modes"].items():
            if str(n) not in rows:
                continue
            r = rows[str(n)]
            ratio = report["inflight_over_dynamic"].get(str(n)) if name == "inflight" else None
            fill = r.get("rows_per_step", r.get("mean_batch")) or 0.0
            lines.append(
                f"| {n} | {name} | {r['puzzles_per_s']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                f"{r['worst_ms']:.1f} | {r['mean_steps'] or 0:.2f} | {fill:.1f} | "
                + (f"{ratio['puzzles_per_s']:.2f}x (p99 {ratio['p99']:.2f}x)" if ratio else "-")
                + " |"
            )
    return "\n".join(lines)


def run(args: argparse.Namespace, work: Path) -> dict:
    from hrm_deploy.backends import open_runner
    from hrm_deploy.halting import resolve_rule
    from hrm_deploy.serve.inflight import InflightScheduler

    artifact, tokens, label = prepare(args, work)
    out = Path(args.out)
    with open_runner(artifact, **open_options(artifact, args.device, args.provider)) as runner:
        halt_text = spread_threshold(runner, tokens) if args.sudoku_size and args.halt == "q" else args.halt
        rule = resolve_rule(halt_text, str(artifact))  # serve's parser; q: the model's own training rule
        halt = rule.should_halt if rule.active else None  # off: every step, as serve runs it
        step_fn, why = pick_step(runner, artifact, halt_text, halt)
        report: dict[str, Any] = {
            "what": "in-flight vs Triton-like dynamic batching in one process (no HTTP, no Triton), early halting on",
            "smoke": args.smoke,
            "artifact": label,
            "runner": runner.name,
            "device": args.device,
            "halt": halt_text,
            "max_batch": args.max_batch,
            "max_queue_delay_us": args.max_queue_delay_us,
            "duration_s_per_point": args.duration,
            "clients": args.clients,
            "puzzles": {"count": len(tokens), "seed": args.seed},
            "inflight_skipped": why,
            "machine": machine(args.device),
            "modes": {"inflight": {}, "dynamic": {}} if step_fn is not None else {"dynamic": {}},
            "inflight_over_dynamic": {},
        }
        if why:
            print(f"inflight skipped: {why}", flush=True)
        print(f"{label} on {runner.name} ({args.device}), --halt {halt_text}", flush=True)
        batcher = DynamicBatcher(runner, halt, args.max_batch, args.max_queue_delay_us / 1e6)
        modes = {"dynamic": Mode("dynamic", dynamic_answer(batcher), tokens, args.check)}
        probes: dict[str, Any] = {"dynamic": lambda: list(batcher.batches)}
        scheduler = None
        if step_fn is not None:
            scheduler = InflightScheduler(step_fn, halt, args.max_batch, queue_limit=1_000_000)
            modes = {"inflight": Mode("inflight", inflight_answer(scheduler), tokens, args.check), **modes}
            probes["inflight"] = scheduler.gauges
        try:
            measure(modes, probes, args, report, out)
        finally:
            batcher.stop()
            if scheduler is not None:
                scheduler.stop(0)
        report["correctness"] = {name: check_answers(runner, halt, tokens, m.kept) for name, m in modes.items()}
    report["machine"]["load_average_end"] = os.getloadavg()
    write(out, report)
    return report


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", help="any artifact open_runner opens (default: the bundled checkpoint)")
    parser.add_argument("--sudoku-size", action="store_true", help="the random-weight Sudoku-size checkpoint")
    parser.add_argument("--step-graph", action="store_true", help="measure the artifact's ONNX step graph (ORT)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (checkpoints, engines)")
    parser.add_argument("--provider", default=None, help="ONNX Runtime provider for .onnx artifacts (cpu, cuda)")
    parser.add_argument("--halt", default="q", help="off | q | threshold:X (--sudoku-size with q: its threshold)")
    parser.add_argument("--clients", default=None, help="closed-loop client counts (default 1,8,32,128)")
    parser.add_argument("--duration", type=float, default=None, help="seconds per point (default 10; smoke 1)")
    parser.add_argument("--max-batch", type=int, default=32, help="in-flight slots and the dynamic max batch")
    parser.add_argument("--max-queue-delay-us", type=int, default=None, help="dynamic batcher (default: serve's)")
    parser.add_argument("--puzzles", type=int, default=PUZZLES, help="distinct puzzles the clients cycle through")
    parser.add_argument("--seed", type=int, default=PUZZLE_SEED, help="puzzle generator seed")
    parser.add_argument("--check", type=int, default=8, help="answers per point compared with a lone run")
    parser.add_argument("--smoke", action="store_true", help="1 s per point, clients 1,8: proves the script runs")
    parser.add_argument("--out", default="benchmarks/results/inflight_load.json")
    args = parser.parse_args(argv)
    from hrm_deploy.serve.server import DEFAULT_QUEUE_DELAY_US

    if args.max_queue_delay_us is None:
        args.max_queue_delay_us = DEFAULT_QUEUE_DELAY_US
    args.clients = [int(c) for c in (args.clients or ("1,8" if args.smoke else "1,8,32,128")).split(",")]
    args.duration = args.duration if args.duration is not None else (1.0 if args.smoke else 10.0)
    with tempfile.TemporaryDirectory() as tmp:
        report = run(args, Path(tmp))
    print(table(report))
    for name, check in report["correctness"].items():
        print(
            f"{name}: {check['mismatches']} of {check['checked']} sampled answers differ from a lone run "
            f"(max |logit diff| {check['max_abs_logit_diff']:.2e})"
        )
    print(f"wrote {args.out}" + (" (smoke run: not a measurement)" if args.smoke else ""))
    return report


if __name__ == "__main__":
    main()
