"""The runner base class: one template for every backend.

Public methods (:meth:`Runner.activate`, :meth:`Runner.infer`, :meth:`Runner.close`) do what
every backend needs the same way: input checks (names, integer dtype, shape [B, S], B > 0),
the cast to int32, chunking to the backend's largest batch (an engine's profile max) and
padding to its smallest, the wall-clock timing, and the ``steps_used`` result. Subclasses
implement ``_activate``, ``_infer(feeds, halt)`` (one batch within their limits) and
``_close``.

``infer(feeds, *, halt=None)`` takes ``inputs`` [B, S] and ``puzzle_identifiers`` [B]
(any integer dtype) and returns host numpy arrays:

- ``logits`` float32 [B, S, V]: after the last ACT step (with ``halt``: each row's halting step);
- ``q_halt_logits`` float32 [B, n] per step (``q_continue_logits`` likewise where available);
  with ``halt``, n is the number of steps the batch ran (NaN beyond a chunk's last step);
- ``step_predictions`` int32 [B, n, S]: per-step argmax, where the backend has them (with
  ``halt``, a row's entries after its halting step repeat that step's);
- ``steps_used`` int32 [B]: ACT steps each row used (``steps`` without halting).

``halt`` is a callable ``(step: int (1-based), q_halt: float32 [B], q_continue: float32 [B])
-> bool [B]`` ("these rows are done"), e.g. ``HaltRule(...).should_halt``; runners without
early halting (``supports_halt = False``) refuse it.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from hrm_deploy.contract import FEEDS, PUZZLE_ROWS, HaltFn
from hrm_deploy.errors import ConfigError, DataError, EngineError
from hrm_deploy.puzzle_table import PuzzleTable, external_table

if TYPE_CHECKING:
    from typing_extensions import Self


class Runner(ABC):
    """Base of every backend runner (see the module docstring for the result contract)."""

    name: ClassVar[str]
    supports_halt: ClassVar[bool] = False
    precision: str = "fp32"
    mode: str = "unrolled"  # "unrolled" or "step"
    steps: int = 0
    seq_len: int | None = None  # checked when known
    min_batch: int = 1
    max_batch: int | None = None  # None: no limit
    last_timing: dict[str, Any] | None = None
    # Settings the runtime actually uses that change its speed (e.g. ORT's intra-op threads),
    # filled by activate(); bench reports them beside the latencies.
    runtime_settings: dict[str, Any] = {}

    _active: bool = False

    def activate(self) -> Self:
        """Load the model / session / engine (idempotent); returns self."""
        if not self._active:
            self._activate()
            self._active = True
        return self

    def close(self) -> None:
        if self._active:
            self._active = False
            self._close()

    def __enter__(self) -> Self:
        return self.activate()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = [k for k in FEEDS if k not in feeds]
        if missing:
            raise DataError(f"infer needs feeds {', '.join(FEEDS)}; missing {', '.join(missing)}")
        inputs, ids = np.asarray(feeds["inputs"]), np.asarray(feeds["puzzle_identifiers"])
        for name, array, ndim in (("inputs", inputs, 2), ("puzzle_identifiers", ids, 1)):
            if array.dtype.kind not in "iu":
                raise DataError(f"{name} must be integer token ids, got dtype {array.dtype}")
            if array.ndim != ndim:
                raise DataError(f"{name} must have {ndim} dimension(s) ([B, S] / [B]), got shape {array.shape}")
        if len(inputs) == 0 or len(ids) != len(inputs):
            raise DataError(
                f"need a batch of at least one row and one puzzle id per row, got {inputs.shape} "
                f"inputs and {ids.shape} ids"
            )
        if self.seq_len is not None and inputs.shape[1] != self.seq_len:
            raise DataError(f"inputs have sequence length {inputs.shape[1]} but this model takes {self.seq_len}")
        return {
            "inputs": np.ascontiguousarray(inputs, np.int32),
            "puzzle_identifiers": np.ascontiguousarray(ids, np.int32),
        }

    def infer(self, feeds: dict[str, np.ndarray], *, halt: HaltFn | None = None) -> dict[str, np.ndarray]:
        """Run one batch of any size (chunked and padded to the backend's limits)."""
        if not self._active:
            raise EngineError(f"the {self.name} runner is not active; call activate() (or use it as a context manager)")
        if halt is not None and not self.supports_halt:
            raise ConfigError(f"the {self.name} runner cannot halt early; run it without a halt rule")
        feeds = self._check(feeds)
        start = time.perf_counter()
        batch = len(feeds["inputs"])
        size = self.max_batch or batch
        parts, timings = [], []
        for begin in range(0, batch, size):
            chunk = {k: v[begin : begin + size] for k, v in feeds.items()}
            rows = len(chunk["inputs"])
            if rows < self.min_batch:  # pad with copies of the last row, drop them after
                chunk = {k: np.concatenate([v, np.repeat(v[-1:], self.min_batch - rows, 0)]) for k, v in chunk.items()}
            out = self._infer(chunk, halt)
            out.setdefault("steps_used", np.full(len(chunk["inputs"]), self.steps, np.int32))
            parts.append({k: v[:rows] for k, v in out.items()})
            if self.last_timing:
                timings.append(self.last_timing)
        result = parts[0] if len(parts) == 1 else _concat(parts)
        timing: dict[str, Any] = {}
        for part in timings:
            for key, value in part.items():
                if key == "peak_gpu_mib":
                    timing[key] = max(timing.get(key) or 0.0, value or 0.0) or None
                elif value is not None:
                    timing[key] = timing.get(key, 0.0) + value
        timing["wall_ms"] = (time.perf_counter() - start) * 1e3
        timing["chunks"] = len(parts)
        self.last_timing = timing
        return result

    @abstractmethod
    def _activate(self) -> None: ...

    @abstractmethod
    def _infer(self, feeds: dict[str, np.ndarray], halt: HaltFn | None) -> dict[str, np.ndarray]:
        """One batch within [min_batch, max_batch]; int32 feeds. May set ``self.last_timing``
        (phase milliseconds, summed over chunks by :meth:`infer`)."""

    def _close(self) -> None:
        """Release sessions / engines (default: nothing)."""


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenate chunk results; per-step arrays of different step counts are NaN/-1 padded."""
    out = {}
    for key in parts[0]:
        arrays = [p[key] for p in parts]
        if arrays[0].ndim >= 2 and key != "logits":
            width = max(a.shape[1] for a in arrays)
            fill = np.nan if arrays[0].dtype.kind == "f" else -1
            arrays = [
                np.concatenate([a, np.full((a.shape[0], width - a.shape[1], *a.shape[2:]), fill, a.dtype)], 1)
                if a.shape[1] < width
                else a
                for a in arrays
            ]
        out[key] = np.concatenate(arrays)
    return out


class LoopRunner(Runner):
    """An engine runner whose batches go through :class:`~hrm_deploy.runtime.device_loop.DeviceLoop`
    (TensorRT, PyTorch engines). Subclasses set ``self.memory`` and ``self.loop`` in ``_activate``;
    the manifest's precision/mode/steps describe the engine (``steps`` only counts for step engines).

    Options: ``steps`` (step engines), ``device`` (GPU index), ``memory`` ("auto", "torch",
    "cuda-python"), ``cuda_graph`` (capture the step loop), ``step_predictions`` (per-step argmax)."""

    supports_halt = True  # step engines; an unrolled engine refuses a halt rule with one clear error
    default_mode = "unrolled"

    def __init__(
        self,
        path: str | Path,
        steps: int | None = None,
        device: int = 0,
        memory: str = "auto",
        cuda_graph: bool = True,
        step_predictions: bool = True,
    ):
        from hrm_deploy.manifest import read_manifest

        self.path, self.device_index, self.memory_kind = Path(path), device, memory
        self.manifest = read_manifest(self.path)
        self.precision = self.manifest.get("precision", "?")
        self.mode = self.manifest.get("mode", self.default_mode)
        self.requested_steps = steps
        self.steps = steps if steps and self.mode == "step" else int(self.manifest.get("steps", 1))
        self.cuda_graph, self.step_predictions = cuda_graph, step_predictions
        self.runtime_settings: dict[str, Any] = {}  # memory backend and loop path, once active
        self.loop: Any = None
        self.memory: Any = None
        self.puzzle_table: PuzzleTable | None = None
        self._step_fn: Any = None  # the step function, made on first use (step_function)

    def activate(self) -> Self:
        super().activate()
        if self.loop is not None:
            self.runtime_settings.update(memory=self.memory.kind, loop=self.loop.path)
            if self.loop.feeds[1] == PUZZLE_ROWS:  # built from an export --puzzle-emb external
                self.puzzle_table = external_table(self.path, self.manifest)
        return self

    def _infer(self, feeds: dict[str, np.ndarray], halt: HaltFn | None) -> dict[str, np.ndarray]:
        if self.puzzle_table is not None:  # the rows of the batch's puzzles, gathered on the host
            feeds = self.puzzle_table.feeds(feeds)
        out, self.last_timing = self.loop.run(feeds, halt)
        self.runtime_settings["loop"] = self.loop.path  # the same dict bench holds: a capture failure shows
        return out

    def warm_up(self, max_batch: int | None = None) -> list[int]:
        """Run every batch bucket that batches of up to ``max_batch`` rows (default: the engine's
        largest) will use, once, with padding puzzles: each plan allocated and its loop captured
        (or, for a compiled fallback, its shapes compiled) before the first real request. The
        loop keeps at least that many plans. Returns the sizes run."""
        from hrm_deploy.runtime.device_loop import warm_sizes

        if self.loop is None:
            raise EngineError("activate() the runner before warming it up")
        low, high = self.loop.adapter.batch_range
        sizes = warm_sizes(low, high, max_batch) if self.loop.buckets else [low, min(high, max_batch or high)]
        self.loop.max_plans = max(self.loop.max_plans, len(sizes))
        seq = self.loop.adapter.tensors["inputs"].shape[-1]
        for size in sizes:
            self.infer({"inputs": np.zeros((size, seq), np.int32), "puzzle_identifiers": np.zeros(size, np.int32)})
        return sizes

    def step_function(self) -> Any:
        """The step engine one ACT step per call (:class:`~hrm_deploy.runtime.device_step.DeviceStep`),
        on a loop of its own beside the runner's: what in-flight serving and continuous batching drive."""
        if self.loop is None:
            raise EngineError("activate() the runner before asking for its step function")
        if self._step_fn is None:
            from hrm_deploy.runtime.device_loop import DeviceLoop
            from hrm_deploy.runtime.device_step import DeviceStep

            # its own plans; its run() is never called, so cuda_graph only governs the per-step graphs
            loop = DeviceLoop(
                self.loop.adapter, self.memory, self.steps, cuda_graph=self.cuda_graph, step_predictions=False
            )
            self._step_fn = DeviceStep(loop, self.puzzle_table)
        return self._step_fn

    def _before_close(self) -> None:
        """Work to do while the loop still exists (e.g. saving a runtime cache)."""

    def _close(self) -> None:
        try:
            if self.loop is not None:
                self._before_close()  # e.g. a runtime-cache save: a failure there must not leak the loop
        finally:
            step_fn = self._step_fn
            if step_fn is not None:  # its own plans first: they share the memory below
                step_fn.loop.close()
            self._step_fn = None
            if self.loop is not None:
                self.loop.close()
            self.loop = None
            if self.memory is not None:
                self.memory.close()
