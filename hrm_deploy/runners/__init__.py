"""Backends that run an artifact, one module each behind the :class:`~hrm_deploy.runners.base.Runner`
base class, and the one table that maps an artifact to its runner (read by verify, bench and
:func:`hrm_deploy.verify.find_reference`).

- ``torch_ref``: a checkpoint, our PyTorch model (the reference);
- ``ort``: an ``.onnx`` graph on ONNX Runtime;
- ``trt``: a TensorRT / TensorRT-RTX ``.engine``/``.plan`` through the device loop (no torch needed);
- ``torch_engine``: a PyTorch engine ``.pt2`` (AOTInductor) through the same device loop.

To add a backend: write ``runners/<name>.py`` with a :class:`Runner` subclass (``name``,
``_activate``, ``_infer(feeds, halt)``, ``_close``), add it to :data:`RUNNERS` and, when it
has its own artifact suffix, to :data:`SUFFIXES`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrm_deploy.errors import ArtifactError, ConfigError

if TYPE_CHECKING:
    from hrm_deploy.runners.base import Runner

# runner name -> "module:class"
RUNNERS = {
    "torch_ref": "hrm_deploy.runners.torch_ref:TorchRunner",
    "ort": "hrm_deploy.runners.ort:OrtRunner",
    "trt": "hrm_deploy.runners.trt:TrtRunner",
    "torch_engine": "hrm_deploy.runners.torch_engine:TorchEngineRunner",
}
# artifact suffix -> runner name; anything else is a checkpoint (torch_ref)
SUFFIXES = {".onnx": "ort", ".engine": "trt", ".plan": "trt", ".pt2": "torch_engine"}
CHECKPOINT_RUNNER = "torch_ref"


def runner_name(artifact: str | Path) -> str:
    """The runner an artifact needs, from its suffix (a checkpoint when none matches)."""
    return SUFFIXES.get(Path(artifact).suffix, CHECKPOINT_RUNNER)


def is_checkpoint(artifact: str | Path) -> bool:
    return runner_name(artifact) == CHECKPOINT_RUNNER


def runner_class(name: str) -> type[Runner]:
    if name not in RUNNERS:
        raise ConfigError(f"runner {name!r} unknown; use one of {', '.join(RUNNERS)}")
    module, cls = RUNNERS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def open_runner(artifact: str | Path, *, runner: str | None = None, **options: Any) -> Runner:
    """A (not yet activated) runner for ``artifact``; ``runner`` overrides the suffix table;
    ``options`` go to the runner's constructor (e.g. ``steps``, ``provider``, ``device``)."""
    path = Path(artifact)
    if not path.exists():
        raise ArtifactError(f"{path} does not exist")
    cls: Any = runner_class(runner or runner_name(path))  # each runner's own constructor options
    return cls(path, **options)
