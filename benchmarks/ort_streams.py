"""One FP32 pass over a quantized build's holdout, run three ways on ONNX Runtime CPU: why the build
measures as streams (``hrm_deploy/streams.py``).

The bundled model's FP32 export (sudoku-small, 8-step unroll) over its 300 held-out puzzles (its
checkpoint's own dataset), in chunks of 8 as the build runs them:

* ``one_session``: one session at ONNX Runtime's default threads (one per core), chunk after chunk
  (how the build ran before streams);
* ``one_thread``: one session at one thread, chunk after chunk;
* ``streams``: the build's way now, :class:`~hrm_deploy.precision.accuracy.GraphRunner` and
  :class:`~hrm_deploy.precision.holdout.Holdout` (one single-thread session called from one thread
  per core, at most four).

The arms alternate pass by pass (``--passes`` rounds), so a shared machine's load falls on all
alike; each arm's median and every pass are recorded, and the outputs of the three are compared
bit for bit. ``by_batch``: the same pass in batches of 8, 64 and 256 (``--batches``), one session
at ONNX Runtime's threads against the batches run as streams, in milliseconds per puzzle (what a
batch size costs any ONNX Runtime CPU workload, not only the build's). The machine's CPU, ISA flags
and load average go into the JSON.

    nice python benchmarks/ort_streams.py [--passes 5]

Writes benchmarks/results/ort_streams.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 8  # puzzles per run call, as the build's holdout (hrm_deploy.precision.holdout.CHUNK)


def by_batch_ms(export: Path, examples: Any, names: list[str], batch: int, streams: int, passes: int) -> dict:
    """Milliseconds per puzzle of one pass in batches of ``batch``: one session at ONNX Runtime's
    threads, and the batches as ``streams`` streams of one thread (medians of ``passes``, alternating)."""
    from hrm_deploy.onnx_runtime import ort_session
    from hrm_deploy.streams import in_order

    feeds = [examples.feeds(start, start + batch) for start in range(0, len(examples), batch)]
    feeds = [{k: np.asarray(v, np.int32) for k, v in f.items()} for f in feeds]
    one, single = ort_session(export), ort_session(export, threads=1)
    arms = {
        "one_session": lambda: [one.run(names, f) for f in feeds],
        "streams": lambda: list(in_order(lambda f: single.run(names, f), feeds, streams)),
    }
    timed: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(passes):
        for name, arm in arms.items():
            wall = time.perf_counter()
            arm()
            timed[name].append(1000 * (time.perf_counter() - wall) / len(examples))
    return {name: round(statistics.median(values), 2) for name, values in timed.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=5, help="rounds of the three arms")
    parser.add_argument("--model", default="sudoku-small", help="a bundled model")
    parser.add_argument("--batches", default="8,64,256", help="batch sizes of the by_batch comparison")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ort_streams.json"))
    args = parser.parse_args()

    from int8_build_time import machine  # the same machine record as the build-time rows

    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.onnx_runtime import load_onnx, ort_session
    from hrm_deploy.precision.accuracy import GraphRunner
    from hrm_deploy.precision.holdout import Holdout
    from hrm_deploy.provenance import default_data
    from hrm_deploy.train.presets import bundled_checkpoint

    folder = Path(tempfile.mkdtemp(prefix="ort-streams-"))
    export = export_onnx(
        bundled_checkpoint(args.model), folder / "model.onnx", ExportConfig(parity=False), quiet=True
    ).path
    data = default_data(export, "--data", {"test": None}).path
    examples = load_examples(str(data), None, split="test")
    feeds = [examples.feeds(start, start + CHUNK) for start in range(0, len(examples), CHUNK)]
    names = ["logits", "q_halt_logits", "q_continue_logits"]

    def sequential(session: Any) -> Any:
        return lambda: [session.run(names, {k: np.asarray(v, np.int32) for k, v in f.items()}) for f in feeds]

    runner = GraphRunner(graph_metadata(load_onnx(export)))

    def streams() -> Any:
        out = Holdout(export, examples, runner, len(examples), len(examples), streams=runner.streams).reference(
            len(examples)
        )
        return out.logits

    arms = {"one_session": sequential(ort_session(export)), "one_thread": sequential(ort_session(export, threads=1))}
    arms["streams"] = streams
    for arm in arms.values():  # sessions started, caches warm: not timed
        arm()
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    cpu: dict[str, list[float]] = {name: [] for name in arms}
    logits: dict[str, np.ndarray] = {}
    for _ in range(args.passes):
        for name, arm in arms.items():
            wall, used = time.perf_counter(), time.process_time()
            out = arm()
            seconds[name].append(round(time.perf_counter() - wall, 3))
            cpu[name].append(round(time.process_time() - used, 3))
            logits[name] = out if name == "streams" else np.concatenate([o[0] for o in out])
    runner.close()
    median = {name: statistics.median(values) for name, values in seconds.items()}
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    by_batch = {str(b): by_batch_ms(export, examples, names, b, runner.streams, args.passes) for b in batches}
    report = {
        "machine": machine(),
        "model": args.model,
        "puzzles": len(examples),
        "chunk": CHUNK,
        "streams": runner.streams,
        "threads_per_stream": runner.threads,
        "passes": args.passes,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "median_seconds": median,
        "one_session_over_streams": round(median["one_session"] / median["streams"], 2),
        "outputs_bit_identical": all(np.array_equal(logits["streams"], other) for other in logits.values()),
        "by_batch_ms_per_puzzle": by_batch,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for name, value in median.items():
        print(f"{name}: {value:.2f} s (median of {args.passes}; every pass {seconds[name]})")
    for batch, arms_ms in by_batch.items():
        print(f"batch {batch}: " + ", ".join(f"{name} {ms} ms per puzzle" for name, ms in arms_ms.items()))
    print(
        f"one session over streams: {report['one_session_over_streams']}x; "
        f"outputs bit-identical: {report['outputs_bit_identical']}; wrote {out}"
    )


if __name__ == "__main__":
    main()
