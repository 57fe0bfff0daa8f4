"""The holdout of every quantized build (its size, its puzzles) and a graph's outputs on examples.

It runs the graph through the base's ONNX Runtime session and step loop
(:mod:`hrm_deploy.onnx_runtime`), not through a backend's runner: the precision room imports no
backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.data.examples import Examples
from hrm_deploy.metrics import accuracy
from hrm_deploy.precision.rule import Outputs

# The holdout: as many puzzles as HOLDOUT_FLOPS of FP32 work, between MIN_HOLDOUT and
# HOLDOUT_SAMPLES. On the bundled model 128 puzzles measured minmax static INT8 0.8 points
# *above* FP32 where 1,000 measured it 1.5 below: one puzzle is 0.1 point of 1,000, 0.8 of 128.
# 1e13 FLOPs is ~1 minute of FP32 on 2 cores: the bundled model gets 1,000 puzzles, a
# Sudoku-size (hidden 512, 16 ACT steps) model the minimum, 64 (the manifest says how many).
HOLDOUT_SAMPLES = 1000
HOLDOUT_FLOPS = 1e13
MIN_HOLDOUT = 64


def _affordable(meta: dict) -> int:
    """Puzzles that :data:`HOLDOUT_FLOPS` of FP32 work run through all the graph's ACT steps."""
    from hrm_deploy.model.families import config_from_dict

    config = config_from_dict(meta["config"])
    d, inter = config.hidden_size, config.intermediate_size
    per_token_block = 2 * (4 * d * d + 3 * d * inter)  # qkv + o, gate_up + down: multiply-adds x 2
    flops = per_token_block * config.total_seq_len * config.blocks_per_step * int(meta["steps"])
    return int(HOLDOUT_FLOPS // max(flops, 1))


def holdout_size(meta: dict, most: int = HOLDOUT_SAMPLES) -> int:
    """Held-out puzzles for a model: as many as :data:`HOLDOUT_FLOPS` of FP32 work allow (at
    least :data:`MIN_HOLDOUT`, at most ``most``). Fixed by the model's shape, not by a clock, so
    one build gives the same engine on an idle or a busy machine."""
    return max(MIN_HOLDOUT, min(most, _affordable(meta)))


# Calibration examples when none are asked for: QuantConfig's measured default (128; on the bundled
# model no K in 32..512 was reliably better, benchmarks/results/calib_size.json), or, for a model so
# costly that even the minimum holdout is over HOLDOUT_FLOPS (a Sudoku-size model: 46 puzzles' worth),
# MIN_HOLDOUT examples that are also the holdout: the calibration pass's FP32 answers are then the
# check's reference, so FP32 runs once per build, not twice (with minmax ranges the holdout sees no
# clipping the calibration did not see; the manifest says the holdout is the calibration set).
CALIB_SAMPLES = 128


def shares_holdout(meta: dict) -> bool:
    """Whether a build of this graph that asks for no holdout size measures on its calibration set."""
    return _affordable(meta) < MIN_HOLDOUT


def measures_on_calibration_set(meta: dict, checked: bool, holdout_samples: int | None) -> bool:
    """Whether a quantized build's job shares its calibration set as the holdout: a checked build
    of a costly graph (:func:`shares_holdout`) that asks for no holdout size."""
    return checked and holdout_samples is None and shares_holdout(meta)


def calibration_size(meta: dict) -> int:
    """Calibration examples of a build that asks for none (see :data:`CALIB_SAMPLES`)."""
    return MIN_HOLDOUT if shares_holdout(meta) else CALIB_SAMPLES


def holdout_examples(data: str, calibration: Examples, count: int) -> Examples:
    """``count`` held-out puzzles: a dataset folder's ``test`` split; from a ``.npz`` (one set), the
    examples calibration did not use (one line when none is left)."""
    from pathlib import Path

    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.errors import DataError

    if not Path(data).is_file():
        return load_examples(data, count, split="test")
    everything = load_examples(data, None)
    seen = {row.tobytes() for row in calibration.inputs}
    keep = np.array([i for i, row in enumerate(everything.inputs) if row.tobytes() not in seen][:count], np.int64)
    if not len(keep):
        raise DataError(
            f"{data}: calibration used every example, none is left to measure the quantized graph on; pass a "
            "dataset folder (its test split is the holdout), a larger .npz, a smaller --calib-samples, or "
            "--no-accuracy-check"
        )
    labels = everything.labels[keep] if everything.labels is not None else None
    return Examples(everything.inputs[keep], everything.puzzle_identifiers[keep], labels, str(data), "")


class GraphRunner:
    """Runs graphs (either mode, any precision; an NVFP4 graph through its CPU simulation) on ONNX
    Runtime CPU and returns their :class:`~hrm_deploy.precision.rule.Outputs`: an unrolled or loop
    graph in one call per batch, a single-step graph driven through all its ACT steps. One session
    per graph file is kept while the file is unchanged (the FP32 graph and the latest candidate), so
    a holdout run chunk by chunk starts each session once. ``meta``: the graphs' ``hrm_deploy.*``
    metadata (mode, steps; every candidate of a build shares the FP32 graph's); ``table_of``: the
    FP32 export whose puzzle table a staged candidate reads (``--puzzle-emb external``);
    ``threads``: the cores it may use (None: every usable core), as :attr:`streams`: that many
    calls at once (at most four) on sessions of :attr:`threads` threads each
    (:mod:`hrm_deploy.streams`; outputs measured bit-identical at 1, 2 and 3 threads and from
    concurrent callers on the bundled model's FP32 and cpu INT8 graphs); ``fp4``: candidates may
    hold FP4 (NVFP4), run through their CPU simulation. Calls from several threads at once are
    safe."""

    KEEP = 2  # sessions kept (least recently used dropped): the FP32 graph's and the current candidate's

    def __init__(
        self,
        meta: dict | None = None,
        table_of: str | Path | None = None,
        threads: int | None = None,
        fp4: bool = False,
    ):
        import threading
        from collections import OrderedDict

        from hrm_deploy.streams import stream_count, threads_per_stream

        self.meta, self.table_of, self.fp4 = meta, table_of, fp4
        self.streams = stream_count(threads)
        # one stream: the session has the threads asked for; several: the cores shared among them
        self.threads = threads if self.streams == 1 else threads_per_stream(threads)
        self._sessions: OrderedDict[tuple[str, int, int, int], Any] = OrderedDict()
        self._lock = threading.Lock()  # concurrent calls open a graph's session once

    def _session(self, path: Path) -> Any:
        with self._lock:
            return self._open(path)

    def _open(self, path: Path) -> Any:
        from hrm_deploy.manifest import check_artifact
        from hrm_deploy.onnx_runtime import ort_session
        from hrm_deploy.precision.nvfp4 import cpu_runnable
        from hrm_deploy.puzzle_table import rows_session

        stat = path.stat()
        key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if key in self._sessions:
            self._sessions.move_to_end(key)
            return self._sessions[key]
        for old in [k for k in self._sessions if k[0] == key[0]]:  # the same path, rewritten
            del self._sessions[old]
        while len(self._sessions) >= self.KEEP:
            self._sessions.popitem(last=False)
        staged = self.table_of is not None and path.resolve() != Path(self.table_of).resolve()
        manifest = None if staged else check_artifact(path)  # a graph whose manifest describes other bytes is refused
        if self.fp4 and staged:  # an NVFP4 candidate (never the FP32 graph) through its CPU simulation
            with cpu_runnable(str(path)) as runnable:
                session = ort_session(runnable, provider="cpu", threads=self.threads)
        else:
            session = ort_session(str(path), provider="cpu", threads=self.threads)
        # export --puzzle-emb external: the session gathers the rows of the ids it is fed
        self._sessions[key] = rows_session(session, self.table_of if self.table_of and staged else path, manifest)
        return self._sessions[key]

    def close(self) -> None:
        """Release every session now (not at the garbage collector's leisure: an ONNX Runtime session
        collected in a forked child can hang it)."""
        self._sessions.clear()

    def __enter__(self) -> GraphRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __call__(self, path: str | Path, examples: Examples, batch: int = 64) -> Outputs:
        from hrm_deploy.contract import HEADS, STEPS_USED
        from hrm_deploy.export.metadata import graph_metadata
        from hrm_deploy.onnx_runtime import load_onnx, run_stepwise
        from hrm_deploy.streams import in_order

        path = Path(path)
        meta = self.meta or graph_metadata(load_onnx(path))
        session = self._session(path)
        names = [*HEADS, STEPS_USED] if meta["mode"] == "loop" else list(HEADS)

        def one(start: int) -> Outputs:
            feeds = {k: np.asarray(v, np.int32) for k, v in examples.feeds(start, start + batch).items()}
            if meta["mode"] == "step":
                return Outputs.of(run_stepwise(session, feeds, None, int(meta["steps"])))
            return Outputs.of(dict(zip(names, session.run(names, feeds))))

        starts = range(0, len(examples), batch)
        # several batches: as streams; one (a holdout's chunk, itself run as a stream): here
        parts = list(in_order(one, starts, self.streams if len(starts) > 1 else 1))
        joined = parts[0]
        for part in parts[1:]:
            joined = joined.join(part)
        return joined


def graph_outputs(path: str | Path, examples: Examples, meta: dict | None = None, batch: int = 64) -> Outputs:
    """One graph's outputs on ``examples`` (see :class:`GraphRunner`; an NVFP4 graph through its CPU
    simulation)."""
    from hrm_deploy.precision.nvfp4 import cpu_runnable

    with cpu_runnable(str(path)) as runnable, GraphRunner(meta) as runner:
        return runner(runnable, examples, batch)


def onnx_accuracy(path: str, examples: Examples, batch: int = 64) -> dict[str, float]:
    """Accuracy of an ONNX graph (either mode) on ONNX Runtime CPU (see :func:`graph_outputs`)."""
    return accuracy(onnx_logits(path, examples, batch), examples.labels)


def onnx_logits(path: str, examples: Examples, batch: int = 64, meta: dict | None = None) -> np.ndarray:
    """Final logits [N, S, V] of an ONNX graph on ONNX Runtime CPU (see :func:`graph_outputs`)."""
    return graph_outputs(path, examples, meta, batch=batch).logits
