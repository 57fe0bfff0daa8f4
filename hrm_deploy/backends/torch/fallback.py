"""The exported program (``torch.export.save``) as the PyTorch engine's fallback: where the build
could not AOT-compile, or a fresh process cannot load the package (the load probe said so).

Compiling the program with ``torch.compile`` takes about a minute on a GPU host and longer on a
small CPU (the bundled model's step: ~45 s of Inductor on 2 cores, per shape class), while a
``verify`` of 20 puzzles runs in seconds eagerly: a compile up front made such a run wait for
minutes with nothing printed. So :class:`FallbackProgram` runs the program eagerly and compiles
it only once the eager work has taken ``compile_after_s`` (about what a compile costs): short
jobs never compile, long ones (``serve``, ``bench``) pay for the compile once they are known to
be long, with a progress display while it runs. ``HRM_DEPLOY_FALLBACK=eager`` or ``compile``
chooses for good.

The program's weights sit on the device it was exported on (the build's ``cuda:0``);
:func:`retarget` moves them, and the device arguments recorded in its graph, to the runner's
device (``--device N``).
"""

from __future__ import annotations

import logging
import os
import time
from enum import Enum
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

COMPILE_AFTER_S = 30.0  # eager seconds after which a compile (about this long) starts to pay
MODE_ENV = "HRM_DEPLOY_FALLBACK"


class FallbackMode(str, Enum):
    """How the fallback runs the exported program."""

    AUTO = "auto"  # eagerly, compiled once the eager work has cost about a compile
    EAGER = "eager"
    COMPILE = "compile"  # torch.compile up front


def fallback_mode() -> FallbackMode:
    """The mode from ``$HRM_DEPLOY_FALLBACK`` (default auto); an unknown value is one error line."""
    from hrm_deploy.errors import ConfigError

    value = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    try:
        return FallbackMode(value)
    except ValueError:
        raise ConfigError(f"{MODE_ENV}={value!r}: use one of {', '.join(m.value for m in FallbackMode)}") from None


def load_program(torch: Any, path: Path, device: Any = None, mode: FallbackMode | None = None) -> FallbackProgram:
    """The exported program at ``path`` on ``device`` (None: where it was saved), run as ``mode``
    says (default :func:`fallback_mode`)."""
    with open(path, "rb") as f:  # a file object: the name need not end in .pt2
        module = torch.export.load(f).module()
    if device is not None:
        module = retarget(torch, module, torch.device(device))
    return FallbackProgram(torch, module, mode or fallback_mode())


def retarget(torch: Any, module: Any, device: Any) -> Any:
    """``module`` (an exported program's GraphModule) with its parameters and buffers on
    ``device``, and every ``device=`` argument in its graph that names another device of the same
    kind (tensors the graph creates, e.g. ``zeros(..., device=cuda:0)``) pointed there too."""
    module = module.to(device)
    changed = False
    for node in module.graph.nodes:
        old = node.kwargs.get("device")
        if isinstance(old, torch.device) and old != device:
            node.kwargs = {**node.kwargs, "device": device}
            changed = True
    if changed:
        module.recompile()
    return module


class FallbackProgram:
    """``module`` called as the engine (positional tensors in, outputs out): eagerly, then, in
    auto mode, compiled once the eager calls have taken :data:`COMPILE_AFTER_S` in all."""

    def __init__(self, torch: Any, module: Any, mode: FallbackMode, compile_after_s: float = COMPILE_AFTER_S):
        self.torch, self.module, self.mode = torch, module, mode
        self.compile_after_s = compile_after_s
        self.eager_s, self.calls = 0.0, 0
        self.compiled: Any = None
        if mode is FallbackMode.COMPILE:
            self.compiled = torch.compile(module, dynamic=True)
        elif mode is FallbackMode.AUTO:
            log.info(
                "running the exported program eagerly; it is compiled (torch.compile) once it has run %.0f s",
                compile_after_s,
            )

    @property
    def path(self) -> str:
        """How calls run now: ``eager`` or ``torch.compile``."""
        return "torch.compile" if self.compiled is not None else "eager"

    def __call__(self, *inputs: Any) -> Any:
        if self.compiled is not None:
            return self.compiled(*inputs)
        start = time.perf_counter()
        out = self.module(*inputs)
        self.calls += 1
        if self.mode is FallbackMode.AUTO:
            self.eager_s += time.perf_counter() - start  # enqueue time on a GPU: a lower bound of the work
            if self.eager_s >= self.compile_after_s and not _capturing(self.torch):
                self._compile(inputs)
        return out

    def _compile(self, inputs: tuple[Any, ...]) -> None:
        """Compile now, with a progress display, by calling the compiled module once on ``inputs``."""
        from hrm_deploy.progress import Stages

        log.warning(
            "the exported program ran %d calls eagerly (%.0f s); compiling it with torch.compile for the rest",
            self.calls,
            self.eager_s,
        )
        compiled = self.torch.compile(self.module, dynamic=True)
        with Stages(quiet=False).stage("torch.compile of the exported program"):
            compiled(*inputs)
        self.compiled = compiled


def _capturing(torch: Any) -> bool:
    """Whether a CUDA graph is being captured on the current stream (no compiling inside one)."""
    cuda = getattr(torch, "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_available() and cuda.is_current_stream_capturing())
    except (RuntimeError, AttributeError):
        return False
