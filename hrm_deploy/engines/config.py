"""What to build: :class:`EngineConfig`, the fields every build reads plus the building backend's
own options (:class:`~hrm_deploy.engines.options.BuildOptions`), every option checked once.

It sits in a module of its own, below the stage that reads it (:mod:`hrm_deploy.engines.build`)
and beside the options it holds, so each builder reads one config: ``EngineConfig`` plus its
backend's options class (``config.options_as(TheirOptions)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

from hrm_deploy.engines.options import (
    BATCH_FIELDS,
    BuildOptions,
    batch_given,
    options_class,
    refuse_foreign,
    split_values,
)
from hrm_deploy.errors import ConfigError, InternalError
from hrm_deploy.precision.registry import PRECISIONS

OptionsT = TypeVar("OptionsT", bound=BuildOptions)

MAX_BATCH = 1 << 16  # TensorRT profiles: int32 dims, and far beyond any GPU's memory for this model


@dataclass(frozen=True)
class EngineConfig:
    """What to build: the fields every build reads, plus ``options``, the building backend's own
    (its row's :class:`~hrm_deploy.engines.options.BuildOptions` class; left out: its defaults).
    None fields take the target profile's default. ``holdout_samples`` and ``calib_cache`` are set
    from Python only (tests and benchmarks size the accuracy check's holdout and keep calibration
    caches apart); the command line leaves them at their defaults."""

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
    holdout_samples: int | None = None  # the accuracy check's puzzles; None: by the model's cost
    calib_cache: str = "calib"  # where calibration ranges are cached, keyed by graph and data
    options: BuildOptions = field(default_factory=BuildOptions)

    def __post_init__(self) -> None:
        """Every option checked here, once: its range, and whether the building backend takes it."""
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r} unknown; use one of {', '.join(PRECISIONS)}")
        self._check_ranges()
        check_target(self.target, self.backend)
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
        check_target(target, backend)
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
        if self.holdout_samples is not None and self.holdout_samples < 1:
            raise ConfigError(f"the accuracy check's holdout must be >= 1 puzzle, got {self.holdout_samples}")
        if self.accuracy_budget is not None and not 0.0 <= self.accuracy_budget <= 100.0:
            raise ConfigError(f"--accuracy-budget is in exact-accuracy points, 0 to 100, got {self.accuracy_budget}")
        if self.accuracy_budget is not None and not PRECISIONS[self.precision].calibrated:  # never recorded unapplied
            calibrated = ", ".join(name for name, row in PRECISIONS.items() if row.calibrated)
            raise ConfigError(
                f"--accuracy-budget bounds what a calibrated precision ({calibrated}) may lose; {self.precision} "
                "is not calibrated and has none: drop it, or build --int8"
            )


def check_target(target: str, backend: str | None) -> None:
    """The cpu target (ONNX Runtime's CPU provider) builds with its own backend only."""
    if target == "cpu" and backend is not None:
        raise ConfigError(
            f"--backend {backend} does not build for --target cpu (ONNX Runtime's CPU provider); drop "
            "--backend, or drop --target cpu (--backend torch builds a PyTorch engine for this machine's CPU)"
        )
