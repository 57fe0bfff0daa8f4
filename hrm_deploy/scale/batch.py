"""``solve FILE --ray`` and ``arc-eval ARTIFACT --ray``: the same batches as one process, run by a pool of
Ray workers, the outputs written in the same order, so they are byte-identical to a single-process run.

A puzzle's answer never depends on its batch-mates, and each batch here is one the single process would
run too:

- ``solve``: the puzzles in batches of ``--batch``, answered in input order as soon as the batches before
  them are;
- ``arc-eval``: a full run's batches are the same row ranges, its records written in row order (a
  contiguous prefix: a killed driver's run resumes from it, single-process or on Ray); with
  ``--early-stop`` each test input runs its chunks of copies one after the other, as in one process,
  while different test inputs run at once, and the records are rewritten at the end in the order the
  single-process run writes them. The rows each test input runs are the same either way (its chunks
  are fixed, and whether it stops after one depends only on its own copies), so the scores, the
  submission and the predictions file are the same.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hrm_deploy.errors import ConfigError, InternalError
from hrm_deploy.io import atomic_path
from hrm_deploy.scale.cluster import RayConfig, connected, worker_resources
from hrm_deploy.scale.pool import ActorPool, ArcWorker, SolveWorker

if TYPE_CHECKING:
    from hrm_deploy.arc.evaluate import ArcEvalConfig, Rows, TaskClock
    from hrm_deploy.arc.sources import Source

log = logging.getLogger(__name__)

IN_FLIGHT = 2  # batches queued per worker: one running, one waiting, so no worker idles between batches


def _options(artifact: Path, runner_options: dict[str, Any], config: RayConfig) -> dict[str, Any]:
    """The runner options a worker opens the artifact with: the caller's, plus its thread count where the
    artifact's backend takes one."""
    from hrm_deploy.registry import runner_options as taken

    return {**taken(artifact, threads=config.threads), **runner_options}


def solve_on_ray(
    artifact: Path,
    runner_options: dict[str, Any],
    rule: Any,
    inputs: np.ndarray,
    pids: np.ndarray,
    batch: int,
    keep: Callable[[dict[str, Any]], None],
    config: RayConfig,
    quiet: bool = False,
) -> None:
    """``inputs`` [N, S] / ``pids`` [N] in batches of ``batch`` on Ray workers; ``keep`` gets each batch's
    outputs in input order. An interrupt keeps what was handed over (as the single-process loop does)."""
    from hrm_deploy.progress import progress

    starts = list(range(0, len(inputs), batch))
    with connected(config) as ray:
        resources, workers = worker_resources(ray, artifact, config)
        args = (str(artifact), _options(artifact, runner_options, config), rule, config.threads)
        pool = ActorPool(ray, SolveWorker, args, resources, workers)
        log.info("solving on %d Ray workers (%s each)", workers, resources)
        results: dict[int, dict[str, Any]] = {}
        try:
            with progress(len(inputs), "solving on Ray", quiet or len(inputs) <= batch, unit="puzzles") as advance:
                queue, handed = iter(starts), 0
                _fill(pool, queue, workers, lambda s: (s, inputs[s : s + batch], pids[s : s + batch]))
                while handed < len(starts):
                    for start, out in pool.finished():
                        results[int(start)] = out  # type: ignore[call-overload]
                    _fill(pool, queue, workers, lambda s: (s, inputs[s : s + batch], pids[s : s + batch]))
                    while handed < len(starts) and starts[handed] in results:
                        part = results.pop(starts[handed])
                        keep(part)
                        advance(len(part["logits"]))
                        handed += 1
        except KeyboardInterrupt:
            return
        finally:
            pool.close()


def _fill(pool: ActorPool, queue: Any, workers: int, make: Callable[[Any], tuple[Any, ...]]) -> None:
    """Queue work from ``queue`` until every worker has :data:`IN_FLIGHT` batches."""
    while len(pool) < IN_FLIGHT * workers:
        item = next(queue, None)
        if item is None:
            return
        pool.submit(*make(item))


def predict_on_ray(
    source: Source,
    rows: Rows,
    preds: Path,
    config: ArcEvalConfig,
    label: str,
    clock: TaskClock | None,
    stopper: Any,
) -> None:
    """The records :func:`hrm_deploy.arc.evaluate.predict` writes into ``preds``, run on Ray workers."""
    from hrm_deploy.arc.sources import LocalSource
    from hrm_deploy.progress import progress

    assert config.ray is not None  # the caller's branch
    if not isinstance(source, LocalSource):
        raise ConfigError("--ray runs an artifact on Ray workers; a server URL already serves it: drop --ray")
    early = stopper is not None
    todo = stopper.pending_rows() if early else len(rows.split) - rows.done
    with connected(config.ray) as ray:
        resources, workers = worker_resources(ray, source.path, config.ray)
        options = _options(source.path, source.runner_options, config.ray)
        args = (str(source.path), options, source.halting or "off", config.ray.threads)
        pool = ActorPool(ray, ArcWorker, args, resources, workers)
        log.info("%s on %d Ray workers (%s each)", label, workers, resources)
        try:
            with progress(rows.done + todo, f"{label} on Ray", config.quiet, unit="rows", done=rows.done) as advance:
                if early:
                    _early(pool, workers, rows, preds, clock, stopper, advance)
                else:
                    _full(pool, workers, rows, preds, clock, advance)
        finally:
            pool.close()
    if early:
        _canonical_order(rows, preds, stopper)


def _run_rows(rows: Rows, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(rows.split.inputs[index]), rows.ids[index]


def _done(rows: Rows, index: np.ndarray, result: tuple[Any, ...], clock: TaskClock | None) -> np.ndarray:
    from hrm_deploy.arc.evaluate import make_records

    pred, q_halt, steps, seconds = result
    if clock is not None:
        clock.charge(index, seconds, steps)
    return make_records(rows, index, pred, q_halt, steps)


def _full(pool: ActorPool, workers: int, rows: Rows, preds: Path, clock: TaskClock | None, advance: Any) -> None:
    """Every row from ``rows.done`` on, in the single-process run's batches, written in row order."""
    from hrm_deploy.arc.evaluate import append_records

    total = len(rows.split)
    starts = iter(range(rows.done, total, rows.batch))

    def work(start: int) -> tuple[Any, ...]:
        index = np.arange(start, min(start + rows.batch, total), dtype=np.int64)
        return (start, *_run_rows(rows, index))

    finished: dict[int, np.ndarray] = {}
    written = rows.done
    _fill(pool, starts, workers, work)
    while written < total:
        for start, result in pool.finished():
            first = int(start)  # type: ignore[call-overload]
            index = np.arange(first, min(first + rows.batch, total), dtype=np.int64)
            finished[first] = _done(rows, index, result, clock)
        _fill(pool, starts, workers, work)
        while written in finished:  # a contiguous prefix: what a resumed run continues from
            records = finished.pop(written)
            append_records(preds, records)
            written += len(records)
            advance(len(records))


def _early(
    pool: ActorPool, workers: int, rows: Rows, preds: Path, clock: TaskClock | None, stopper: Any, advance: Any
) -> None:
    """Each unsettled test input's next chunk as soon as its last one is added; the records in the order
    they finish (rewritten in the single-process order at the end)."""
    from hrm_deploy.arc.evaluate import append_records

    busy: set[tuple[str, str]] = set()

    def refill() -> None:
        while len(pool) < IN_FLIGHT * workers:
            batch = stopper.next_batch(rows.batch, busy)
            if not batch:
                return
            index = np.asarray(batch, dtype=np.int64)
            busy.update(stopper.keys[int(r)] for r in batch)
            pool.submit(tuple(batch), *_run_rows(rows, index))

    refill()
    while len(pool):
        for batch, result in pool.finished():
            index = np.asarray(batch, dtype=np.int64)
            records = _done(rows, index, result, clock)
            append_records(preds, records)
            busy.difference_update(stopper.keys[int(r)] for r in index)
            advance(len(index) + stopper.add(records, rows.ids, rows.split.inputs))
        refill()


def _canonical_order(rows: Rows, preds: Path, stopper: Any) -> None:
    """Rewrite an early-stopped run's records (atomically) in the order one process writes them: its
    scheduler replayed over the records, which hold every row it asks for."""
    from hrm_deploy.arc.early_stop import EarlyStop
    from hrm_deploy.arc.evaluate import _load_records

    records = _load_records(preds, rows.split.metadata.seq_len, any_order=True, halting=rows.halting)
    by_row = {int(r): i for i, r in enumerate(records["row"])}
    replay = EarlyStop(stopper.keys, stopper.labels, stopper.ks, stopper.identifiers)
    order: list[int] = []
    while batch := replay.next_batch(rows.batch):
        missing = [r for r in batch if r not in by_row]
        if missing:
            raise InternalError(f"the early stop's replay asks for rows no worker ran: {missing[:5]}")
        part = records[[by_row[r] for r in batch]]
        order += [by_row[r] for r in batch]
        replay.add(part, rows.ids, rows.split.inputs)
    if len(order) != len(records):
        raise InternalError(f"the replay wrote {len(order)} of {len(records)} records")
    with atomic_path(preds) as staged:
        staged.write_bytes(records[order].tobytes())
