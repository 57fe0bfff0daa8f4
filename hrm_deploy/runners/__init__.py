"""Backends that run an artifact, one module each behind the :class:`~hrm_deploy.runtime.base.Runner`
base class, and :func:`open_runner`, which picks the runner from the artifact's suffix
(:data:`hrm_deploy.artifacts.SUFFIXES`, the table verify, bench and
:func:`hrm_deploy.artifacts.find_reference` read too).

- ``torch_ref``: a checkpoint, our PyTorch model (the reference);
- ``ort``: an ``.onnx`` graph on ONNX Runtime;
- ``trt``: a TensorRT / TensorRT-RTX ``.engine``/``.plan`` through the device loop (no torch needed);
- ``torch_engine``: a PyTorch engine ``.pt2`` (AOTInductor) through the same device loop.

Beside them: ``adapter``, ``device_loop`` and ``memory`` (the engine path), ``halting`` (halt
rules, continuous batching), ``infer`` (runners over examples), and what building and running
engines share: ``backend`` (TensorRT vs TensorRT-RTX) and ``compat`` (does an engine fit here).

To add a backend: write ``runners/<name>.py`` with a :class:`Runner` subclass (``name``,
``_activate``, ``_infer(feeds, halt)``, ``_close``), add it to :data:`RUNNERS` and, when it
has its own artifact suffix, to :data:`hrm_deploy.artifacts.SUFFIXES`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrm_deploy.artifacts import runner_name
from hrm_deploy.errors import ArtifactError, ConfigError

if TYPE_CHECKING:
    from hrm_deploy.runtime.base import Runner

# runner name (the values of hrm_deploy.artifacts.SUFFIXES, and its CHECKPOINT_RUNNER) -> "module:class"
RUNNERS = {
    "torch_ref": "hrm_deploy.backends.reference:TorchRunner",
    "ort": "hrm_deploy.backends.ort.runner:OrtRunner",
    "trt": "hrm_deploy.backends.tensorrt.runner:TrtRunner",
    "torch_engine": "hrm_deploy.backends.torch.runner:TorchEngineRunner",
}


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
