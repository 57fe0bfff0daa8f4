"""The engine stage: an ONNX export (or a checkpoint) -> an engine + manifest, for a target.

``build_engine`` is one function from artifact to artifact, and it composes the pipeline: the
options are validated once (:class:`EngineConfig`), the chosen backend's builder is looked up in the
backend table (:func:`hrm_deploy.engines.request.builder`) and asked to refuse what it cannot build before
any work, then the stage resolves the source (the newest export by default), exports the
single-step graph where the builder prefers it to an unroll, makes the precision graph where the
builder takes one (:func:`hrm_deploy.precision.convert.make_precision_graph`) and hands the
builder that ready graph in a :class:`~hrm_deploy.engines.request.BuildRequest`. Builders:
TensorRT / TensorRT-RTX (:mod:`hrm_deploy.backends.tensorrt.builder`), the ``cpu`` target's ONNX
Runtime graphs (:mod:`hrm_deploy.backends.ort.builder`), PyTorch AOTInductor
(:mod:`hrm_deploy.backends.torch.builder`); none of them exports or converts precision.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hrm_deploy.engines.options import (
    BATCH_FIELDS,
    BuildOptions,
    batch_given,
    options_class,
    refuse_foreign,
    split_values,
)
from hrm_deploy.engines.request import Builder, BuildRequest, GraphInput, builder
from hrm_deploy.engines.result import EngineResult, newest_export, recorded_data_fields
from hrm_deploy.engines.targets import ENGINE_PRECISIONS, get_target
from hrm_deploy.errors import ArtifactError, ConfigError, InternalError
from hrm_deploy.manifest import check_artifact, manifest_path
from hrm_deploy.onnx_runtime import load_onnx, made_from
from hrm_deploy.precision.registry import PRECISIONS, get_precision

if TYPE_CHECKING:
    from onnx import ModelProto

__all__ = [
    "ENGINE_PRECISIONS",
    "EngineConfig",
    "EngineResult",
    "build_engine",
    "default_precision",
    "newest_export",
    "refuse_checkpoint_source",
]

log = logging.getLogger(__name__)
OptionsT = TypeVar("OptionsT", bound=BuildOptions)

MAX_BATCH = 1 << 16  # TensorRT profiles: int32 dims, and far beyond any GPU's memory for this model


@dataclass(frozen=True)
class EngineConfig:
    """What to build: the fields every build reads, plus ``options``, the building backend's own
    (its row's :class:`~hrm_deploy.engines.options.BuildOptions` class; left out: its defaults).
    None fields take the target profile's default."""

    precision: str = "fp16"
    target: str = "desktop"
    backend: str | None = None
    min_batch: int | None = None  # the batch profile (TensorRT; PyTorch reads max_batch; the cpu target none)
    opt_batch: int | None = None
    max_batch: int | None = None
    calib_data: str | None = None
    calib_method: str = "minmax"  # see QuantConfig: measured defaults
    calib_samples: int | None = None  # None: by the model's cost (precision.accuracy.calibration_size)
    accuracy_budget: float | None = None
    accuracy_check: bool = True  # INT8, FP8, NVFP4 (every target): compared with FP32 on held-out puzzles
    options: BuildOptions = field(default_factory=BuildOptions)

    def __post_init__(self) -> None:
        """Every option checked here, once: its range, and whether the building backend takes it."""
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r} unknown; use one of {', '.join(PRECISIONS)}")
        self._check_ranges()
        _check_target(self.target, self.backend)
        receiver = options_class(self.target, self.backend)
        if type(self.options) is BuildOptions and receiver is not BuildOptions:  # none given: the defaults
            object.__setattr__(self, "options", receiver())
        wrong = not isinstance(self.options, receiver)
        foreign = batch_given(receiver, vars(self)) + (self.options.given() if wrong else [])
        refuse_foreign(foreign, self.target, receiver)
        if wrong:
            raise ConfigError(
                f"{type(self.options).__name__} are the options of {type(self.options).taker}; this build "
                f"({receiver.taker}) takes {receiver.__name__}"
            )
        self.options.check(self)

    @classmethod
    def from_values(cls, values: Mapping[str, Any], **common: Any) -> EngineConfig:
        """An EngineConfig from the ``common`` fields and every backend's options by field name
        (``values``: unset ones at their defaults, as the command line passes them): the building
        backend's options class takes its own; another backend's option set away from its default
        is refused in one line."""
        target, backend = common.get("target", "desktop"), common.get("backend")
        _check_target(target, backend)
        receiver = options_class(target, backend)
        options, foreign = split_values(receiver, values)
        if foreign:
            refuse_foreign(batch_given(receiver, common) + foreign, target, receiver)
        return cls(**common, options=options)

    def options_as(self, kind: type[OptionsT]) -> OptionsT:
        """The options as ``kind``, the building backend's class (a builder reads its own)."""
        if not isinstance(self.options, kind):
            raise InternalError(f"a {kind.__name__} builder got {type(self.options).__name__}")
        return self.options

    def record(self) -> dict[str, Any]:
        """The manifest's ``config``: the common fields and the backend's options, side by side."""
        common = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "options"}
        return {**common, **asdict(self.options)}

    def _check_ranges(self) -> None:
        for name, flag in BATCH_FIELDS:
            value = getattr(self, name)
            if value is not None and not 1 <= value <= MAX_BATCH:
                raise ConfigError(f"{flag} must be between 1 and {MAX_BATCH}, got {value}")
        if self.calib_samples is not None and not 1 <= self.calib_samples <= 1_000_000:
            raise ConfigError(f"--calib-samples must be between 1 and 1000000, got {self.calib_samples}")
        if self.accuracy_budget is not None and not 0.0 <= self.accuracy_budget <= 100.0:
            raise ConfigError(f"--accuracy-budget is in exact-accuracy points, 0 to 100, got {self.accuracy_budget}")
        if self.accuracy_budget is not None and not PRECISIONS[self.precision].calibrated:  # never recorded unapplied
            calibrated = ", ".join(name for name, row in PRECISIONS.items() if row.calibrated)
            raise ConfigError(
                f"--accuracy-budget bounds what a calibrated precision ({calibrated}) may lose; {self.precision} "
                "is not calibrated and has none: drop it, or build --int8"
            )


def _check_target(target: str, backend: str | None) -> None:
    """The cpu target (ONNX Runtime's CPU provider) builds with its own backend only."""
    if target == "cpu" and backend is not None:
        raise ConfigError(
            f"--backend {backend} does not build for --target cpu (ONNX Runtime's CPU provider); drop "
            "--backend, or drop --target cpu (--backend torch builds a PyTorch engine for this machine's CPU)"
        )


def build_row(target: str, backend: str | None):
    """The backend-table row that builds for ``backend`` (None: the target's default backend)."""
    from hrm_deploy.registry import build_entry

    return build_entry(backend or get_target(target).backends[0])


def default_precision(target: str, backend: str | None) -> str:
    """The precision of a build that asks for none: the building backend's row says (TensorRT fp16,
    the cpu target and PyTorch fp32)."""
    return build_row(target, backend).default_precision


def refuse_checkpoint_source(source: Path | None, target: str, backend: str | None) -> None:
    """One line, before any work, when ``source`` is a checkpoint and the building backend builds
    only from an ONNX graph (its row says)."""
    from hrm_deploy.artifacts import is_checkpoint

    row = build_row(target, backend)
    if source is None or row.builds_from_checkpoint or not source.is_file() or not is_checkpoint(source):
        return
    raise ConfigError(
        f"{source} is a checkpoint; {row.title or row.name} builds from an ONNX graph: run `hrm-deploy export "
        f"{source}` first (then build-engine takes the newest export), or add --backend torch"
    )


def build_engine(
    onnx_path: str | os.PathLike | None, config: EngineConfig, out: str | os.PathLike | None = None, quiet: bool = False
) -> EngineResult:
    """Build an engine for ``config.target`` from ``onnx_path`` (default: newest export).
    ``config.backend == "torch"``: a PyTorch (AOTInductor) engine for this machine instead;
    ``onnx_path`` may then also be a checkpoint. The ``cpu`` target makes an ORT-optimized ONNX.
    The stage composes (see the module docstring); the backend's builder builds the ready graph."""
    target = get_target(config.target)
    backend = config.backend or target.backends[0]  # the cpu target refuses --backend in EngineConfig
    make = builder(backend)
    request = make.preflight(BuildRequest(config, target, backend, Path(out) if out else None, quiet))
    src = Path(onnx_path) if onnx_path else newest_export()
    with made_from(src):  # a graph made from it that ONNX Runtime refuses to load is named by it
        return _compose(make, request, src)


def _compose(make: Builder, request: BuildRequest, src: Path) -> EngineResult:
    """The build of ``src`` once the builder's preflight passed: the steps of the module docstring."""
    config, quiet = request.config, request.quiet
    if make.takes is GraphInput.SOURCE:  # an export or a checkpoint, as given
        return make.build(replace(request, graph=src, source=src))
    if not src.is_file():
        raise ArtifactError(f"{src} does not exist; run `hrm-deploy export` first or pass the ONNX path")
    check_artifact(src)  # before any conversion: the export is what its manifest says
    source, facts = src, dict(request.facts)
    # the one parse of the FP32 graph (weights loaded where a precision graph is made from it)
    weights = config.precision != "fp32"
    model = load_onnx(src, weights=weights)
    request = replace(request, source=src, model=model)
    instead = make.step_instead(src, request)
    if instead is not None:  # before calibration or conversion: build the same checkpoint's step graph
        if not quiet:
            log.info(instead.why)
        src = _step_graph(src, quiet)
        model = load_onnx(src, weights=weights)  # the graph built from now on, parsed once too
        facts["step_instead_of_unrolled"] = instead.record
    graph = src
    if make.takes is GraphInput.PRECISION and config.precision != "fp32":
        graph = _precision_graph(src, model, config, quiet)
        model = None  # the builder reads the precision graph, not this one
    return make.build(replace(request, graph=graph, source=source, facts=facts, model=model))


def _step_graph(unrolled: Path, quiet: bool) -> Path:
    """The single-step graph of the checkpoint ``unrolled`` was exported from (its manifest's parent),
    exported beside it with the same opset and batch limit; an existing one of that checkpoint is reused."""
    from hrm_deploy.artifacts import find_reference
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.manifest import read_manifest, resolve_parent

    checkpoint = find_reference(unrolled)
    step = unrolled.with_name(unrolled.name.removesuffix(".onnx") + ".step.onnx")
    if step.is_file() and manifest_path(step).is_file():
        recorded = read_manifest(step) or {}
        parent = resolve_parent(step, recorded)
        if parent is not None and parent.resolve() == checkpoint.resolve() and recorded.get("mode") == "step":
            check_artifact(step)
            return step
    exported = (read_manifest(unrolled) or {}).get("config", {}).get("export", {})
    export = ExportConfig(
        mode="step", opset=int(exported.get("opset", 18)), max_batch=int(exported.get("max_batch", 64))
    )
    return export_onnx(checkpoint, step, export, quiet=quiet, **recorded_data_fields(unrolled)).path


def _precision_graph(onnx_path: Path, model: ModelProto | None, config: EngineConfig, quiet: bool) -> Path:
    """``onnx_path`` (parsed: ``model``) at ``config.precision``: itself when it already is, else the
    precision stage's graph of the FP32 export (calibrated on the checkpoint's own data unless
    --calib-data, sized by the model's cost unless --calib-samples: the job preamble decides), made
    from ``model`` without parsing the file again."""
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph

    meta = graph_metadata(model if model is not None else load_onnx(onnx_path))
    have = meta.get("precision", "fp32")
    if have == config.precision:
        return onnx_path
    if have != "fp32":
        raise ConfigError(f"{onnx_path} is a {have} graph but {config.precision} was asked for; pass the FP32 export")
    if not quiet:
        what = "calibrating and quantizing" if get_precision(config.precision).calibrated else "converting"
        log.info(f"{onnx_path.name} is FP32: {what} it to {config.precision} first")
    precision = PrecisionConfig(
        config.precision,
        calib_data=config.calib_data,
        quant=QuantConfig(method=config.calib_method, samples=config.calib_samples),
        accuracy_budget=config.accuracy_budget,
        accuracy_check=config.accuracy_check,
    )
    return make_precision_graph(onnx_path, precision, quiet=quiet, model=model).path
