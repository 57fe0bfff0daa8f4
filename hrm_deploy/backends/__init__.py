"""The backends, one package each, and the lookup every stage uses to run one: :func:`open_runner`
(an artifact -> its runner). It reads the table in :mod:`hrm_deploy.registry` and imports the
backend only then; the build stage finds a builder there too (:func:`hrm_deploy.engines.request.builder`).

- :mod:`.reference`: a checkpoint, our PyTorch SDPA model (the reference);
- :mod:`.ort`: ``.onnx`` graphs on ONNX Runtime, and the ``cpu`` target's builds;
- :mod:`.tensorrt`: TensorRT / TensorRT-RTX ``.engine``/``.plan`` files (build, and run through the
  device loop without torch);
- :mod:`.torch`: PyTorch AOTInductor ``.pt2`` engines (build, and run through the same loop).

What their runners share (the Runner template, device loop, memory) is :mod:`hrm_deploy.runtime`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrm_deploy.errors import ArtifactError, ConfigError
from hrm_deploy.registry import BACKENDS, CHECKPOINT_RUNNER, load, runner_name

if TYPE_CHECKING:
    from hrm_deploy.runtime.base import Runner


def runner_class(name: str) -> type[Runner]:
    """The runner class of backend ``name`` (a row of :data:`hrm_deploy.registry.BACKENDS`)."""
    if name not in BACKENDS:
        raise ConfigError(f"runner {name!r} unknown; use one of {', '.join(BACKENDS)}")
    return load(BACKENDS[name].runner)  # type: ignore[no-any-return]


def open_runner(artifact: str | Path, *, runner: str | None = None, **options: Any) -> Runner:
    """A (not yet activated) runner for ``artifact``; ``runner`` overrides the suffix table;
    ``options`` go to the runner's constructor (e.g. ``steps``, ``provider``, ``device``)."""
    path = Path(artifact)
    if not path.exists():
        raise ArtifactError(f"{path} does not exist")
    cls: Any = runner_class(runner or runner_name(path))  # each runner's own constructor options
    return cls(path, **options)


def reference_runner(checkpoint: str | Path, **options: Any) -> Runner:
    """The reference every other artifact is compared with: the checkpoint on the PyTorch SDPA
    model (the table's checkpoint row), whatever its file name."""
    return open_runner(checkpoint, runner=CHECKPOINT_RUNNER, **options)
