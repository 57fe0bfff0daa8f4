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
bit for bit. The machine's CPU, ISA flags and load average go into the JSON.

    nice python benchmarks/ort_streams.py [--passes 5]

Writes benchmarks/results/ort_streams.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 8  # puzzles per run call, as the build's holdout (hrm_deploy.precision.holdout.CHUNK)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=5, help="rounds of the three arms")
    parser.add_argument("--model", default="sudoku-small", help="a bundled model")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "ort_streams.json"))
    args = parser.parse_args()

    from hrm_deploy.backends.ort.builder.isa import isa_flags
    from hrm_deploy.bench.profile import cpu_description
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
    report = {
        "machine": {
            "cpu": cpu_description(),
            "isa": isa_flags(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
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
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for name, value in median.items():
        print(f"{name}: {value:.2f} s (median of {args.passes}; every pass {seconds[name]})")
    print(
        f"one session over streams: {report['one_session_over_streams']}x; "
        f"outputs bit-identical: {report['outputs_bit_identical']}; wrote {out}"
    )


if __name__ == "__main__":
    main()
