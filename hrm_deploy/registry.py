"""The backend table: one row per backend, the only place that names them.

Plain data with lazy ``"module:attr"`` strings, so importing it imports no backend (it sits in
the base: every room can tell an engine from a checkpoint without loading TensorRT or torch).
:mod:`hrm_deploy.backends` turns a row into a runner, :func:`hrm_deploy.engines.request.builder` into
a typed builder and :mod:`hrm_deploy.engines.options` into its build options; ``verify``, ``bench``,
``solve``, ``serve`` and ``build-engine`` go through them and never import a backend by name.

Adding a backend = one package under ``hrm_deploy/backends/`` (a :class:`~hrm_deploy.runtime.base.Runner`
subclass, optionally a builder) + one :class:`BackendEntry` row here (see docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BackendEntry:
    """One backend. ``name`` is its one name: its package (module) under ``hrm_deploy/backends/``,
    its runner's name (reports record it; ``open_runner(runner=...)`` picks it) and, where it builds,
    its ``build-engine --backend`` name (``builds_for``; TensorRT also builds the TensorRT-RTX
    flavour); ``runner`` and ``builder`` are ``"module:attr"`` strings imported on first use."""

    name: str
    runner: str  # "module:Class", a Runner subclass
    suffixes: tuple[str, ...] = ()  # artifact file suffixes it runs
    # "module:object": its build side, a hrm_deploy.engines.request.Builder (what graph it takes,
    # a preflight, build(BuildRequest) -> EngineResult), looked up by engines.request.builder
    builder: str | None = None
    builds_for: tuple[str, ...] = ()  # `build-engine --backend` names (a target's backends) it builds for
    # runner options only this backend takes (e.g. ONNX Runtime's provider): a stage that offers one
    # passes it through runner_options(), never by checking the artifact's suffix
    options: tuple[str, ...] = ()
    # what its artifacts are: "checkpoint", "onnx" (a graph), "engine" (compiled, opaque without its
    # runtime) or "pt2" (an engine whose manifest carries its model config)
    kind: str = "engine"
    # its builds' precision when none is asked for, and whether it builds from a checkpoint too (its
    # builder takes GraphInput.SOURCE) or only from an ONNX graph; the CLI reads both here
    default_precision: str = "fp16"
    builds_from_checkpoint: bool = False
    title: str = ""  # what it builds, for messages ("TensorRT", "the cpu target")
    # "module:Class": the options only its builds take, a hrm_deploy.engines.options.BuildOptions
    # subclass with its own checks (None: none of its own); EngineConfig.options holds one
    build_options: str | None = None


BACKENDS: dict[str, BackendEntry] = {
    entry.name: entry
    for entry in (
        # a checkpoint (no suffix of its own): the PyTorch SDPA reference
        BackendEntry("reference", "hrm_deploy.backends.reference:TorchRunner", kind="checkpoint"),
        BackendEntry(
            "ort",
            "hrm_deploy.backends.ort.runner:OrtRunner",
            (".onnx",),
            "hrm_deploy.backends.ort.builder.target:BUILDER",
            ("ort",),
            ("provider", "threads"),
            "onnx",
            default_precision="fp32",
            title="the cpu target",
            build_options="hrm_deploy.backends.ort.builder.options:CpuOptions",
        ),
        BackendEntry(
            "tensorrt",
            "hrm_deploy.backends.tensorrt.runner:TrtRunner",
            (".engine", ".plan"),
            "hrm_deploy.backends.tensorrt.builder.engine:BUILDER",
            ("tensorrt", "tensorrt-rtx"),
            title="TensorRT",
            build_options="hrm_deploy.backends.tensorrt.builder.options:TensorRTOptions",
        ),
        BackendEntry(
            "torch",
            "hrm_deploy.backends.torch.runner:TorchEngineRunner",
            (".pt2",),
            "hrm_deploy.backends.torch.builder.engine:BUILDER",
            ("torch",),
            kind="pt2",
            default_precision="fp32",
            builds_from_checkpoint=True,
            title="PyTorch AOTInductor",
            build_options="hrm_deploy.backends.torch.builder.options:TorchOptions",
        ),
    )
}
CHECKPOINT_RUNNER = "reference"  # anything without a backend's suffix is a checkpoint


def load(ref: str) -> Any:
    """The object a row's ``"module:attr"`` string names (its module imported now, on first use)."""
    import importlib

    module, attr = ref.split(":")
    return getattr(importlib.import_module(module), attr)


def build_entry(backend: str) -> BackendEntry:
    """The row that builds for ``build-engine --backend BACKEND`` (one clear error when none does)."""
    from hrm_deploy.errors import ConfigError

    for entry in BACKENDS.values():
        if backend in entry.builds_for and entry.builder:
            return entry
    known = [name for entry in BACKENDS.values() for name in entry.builds_for]
    raise ConfigError(f"no builder for backend {backend!r}; use one of {', '.join(known)}")


def runner_name(artifact: str | Path) -> str:
    """The backend that runs ``artifact``, from its suffix (a checkpoint when none matches)."""
    suffix = Path(artifact).suffix
    for entry in BACKENDS.values():
        if suffix in entry.suffixes:
            return entry.name
    return CHECKPOINT_RUNNER


def artifact_kind(artifact: str | Path) -> str:
    """What ``artifact`` is, from its backend's row: "checkpoint", "onnx", "engine" or "pt2"."""
    return BACKENDS[runner_name(artifact)].kind


def engine_suffixes() -> tuple[str, ...]:
    """Every suffix some backend runs (the artifacts that are not checkpoints)."""
    return tuple(s for entry in BACKENDS.values() for s in entry.suffixes)


def runner_options(artifact: str | Path, **offered: Any) -> dict[str, Any]:
    """The ``offered`` runner options (None: not given) that the backend running ``artifact``
    takes, from its row's ``options``: ``--provider`` reaches an ONNX graph's runner and is left
    out for an engine or a checkpoint."""
    takes = BACKENDS[runner_name(artifact)].options
    return {name: value for name, value in offered.items() if value is not None and name in takes}
