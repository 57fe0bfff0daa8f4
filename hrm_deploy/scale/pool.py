"""A pool of Ray actors, each holding one runner of the artifact (loaded once), with work kept in flight.

Work is submitted with a key and comes back, with its key, in the order it finishes. An actor whose
process dies (killed, out of memory, its machine lost) is restarted by Ray and the work it held is run
again on it (``max_restarts`` / ``max_task_retries``): every piece of work here is a pure function of its
inputs, so running it twice gives the same answer. Work still failing after that is one line.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable
from types import ModuleType
from typing import Any

from hrm_deploy.errors import MachineError

log = logging.getLogger(__name__)

RESTARTS = 3  # times Ray restarts a dead actor (and retries the work it held) before giving up


class SolveWorker:
    """One runner of ``artifact`` with a halting rule (``halt``: a resolved :class:`hrm_deploy.halting.HaltRule`
    or None): ``run(inputs, ids)`` is the runner's ``infer`` on one batch."""

    def __init__(self, artifact: str, runner_options: dict[str, Any], halt: Any, threads: int):
        _threads(threads)
        from hrm_deploy.backends import open_runner

        self.runner = open_runner(artifact, **runner_options)
        self.runner.activate()
        self.halt = {"halt": halt.should_halt} if halt is not None and halt.active else {}

    def run(self, inputs: Any, ids: Any) -> dict[str, Any]:
        return dict(self.runner.infer({"inputs": inputs, "puzzle_identifiers": ids}, **self.halt))

    def pid(self) -> int:
        import os

        return os.getpid()


class ArcWorker:
    """One :class:`hrm_deploy.arc.sources.LocalSource` of ``artifact``: ``run(inputs, ids)`` gives its
    (prediction, q_halt, steps) for one batch of test rows and the seconds it took."""

    def __init__(self, artifact: str, runner_options: dict[str, Any], halt: str, threads: int):
        _threads(threads)
        from pathlib import Path

        from hrm_deploy.arc.sources import LocalSource

        self.source = LocalSource(Path(artifact), runner_options, halt)
        self.source.open()

    def run(self, inputs: Any, ids: Any) -> tuple[Any, Any, Any, float]:
        start = time.perf_counter()
        pred, q_halt, steps = self.source.run(inputs, ids)
        return pred, q_halt, steps, time.perf_counter() - start

    def pid(self) -> int:
        import os

        return os.getpid()


def _threads(threads: int) -> None:
    """Torch's threads in this worker (ONNX Runtime's come through the runner options)."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(threads)


class ActorPool:
    """``workers`` actors of ``worker_class(*args)`` with ``resources`` each; :meth:`submit` queues work on
    the least busy one, :meth:`finished` waits for the next results."""

    def __init__(
        self, ray: ModuleType, worker_class: type, args: tuple[Any, ...], resources: dict[str, float], workers: int
    ):
        self.ray = ray
        remote = ray.remote(worker_class).options(max_restarts=RESTARTS, max_task_retries=RESTARTS, **resources)
        self.actors = [remote.remote(*args) for _ in range(workers)]
        self.load = [0] * workers
        self.pending: dict[Any, tuple[Hashable, int]] = {}  # object ref -> (key, actor)

    def submit(self, key: Hashable, *payload: Any) -> None:
        actor = min(range(len(self.actors)), key=self.load.__getitem__)
        self.load[actor] += 1
        self.pending[self.actors[actor].run.remote(*payload)] = (key, actor)

    def __len__(self) -> int:
        return len(self.pending)

    def finished(self) -> list[tuple[Hashable, Any]]:
        """Wait for at least one piece of work; (key, result) of every one done, in the order they finished."""
        done, rest = self.ray.wait(list(self.pending), num_returns=1)
        if rest:  # and whatever else is done by now
            done += self.ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        results = []
        for ref in done:
            key, actor = self.pending.pop(ref)
            self.load[actor] -= 1
            try:
                results.append((key, self.ray.get(ref)))
            except self.ray.exceptions.RayActorError as exc:
                raise MachineError(
                    f"a Ray worker died {RESTARTS + 1} times running the same work ({type(exc).__name__}); "
                    "check the workers' memory and logs (ray logs), then run again: finished work is kept"
                ) from None
        return results

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors, self.pending = [], {}
