"""The fixed choices the commands offer, as Enums so ``--help`` lists them and Typer refuses
anything else in one line. The library takes plain strings: commands pass ``.value`` (or ``str()``
of a generated choice).

``Precision``, ``Target`` and ``Backend`` are generated from their tables (the precision table,
the targets, the backend table: plain data, light to import), so a new row is a new choice. The
library modules that define the other choices import torch or ONNX, so the command line keeps
its own light copy of those; tests/cli/test_choices.py checks each against the library's."""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import TYPE_CHECKING

from hrm_deploy.engines.targets import TARGETS
from hrm_deploy.precision.registry import converted
from hrm_deploy.registry import BACKENDS


class _Choice(str, Enum):
    """A generated choice: ``str()`` is its value (what the library takes)."""

    def __str__(self) -> str:
        return str(self.value)


def make_choice(name: str, values: Iterable[str], doc: str) -> type[_Choice]:
    choice = _Choice(name, {v.upper().replace("-", "_"): v for v in values})  # type: ignore[call-overload]
    choice.__doc__ = doc
    return choice  # type: ignore[no-any-return]


if TYPE_CHECKING:  # a generated Enum of strings; type checkers see the values it holds
    Precision = str
    Target = str
    Backend = str
else:
    Precision = make_choice(
        "Precision", [*converted(), "fp32"], "Engine precision (the rows of ``hrm_deploy.precision.registry``)."
    )
    Target = make_choice("Target", TARGETS, "Build target (``hrm_deploy.engines.targets.TARGETS``).")
    # the table's builders, less the cpu target's (it takes no --backend)
    Backend = make_choice(
        "Backend",
        [n for entry in BACKENDS.values() for n in entry.builds_for if n not in TARGETS["cpu"].backends],
        "Engine builder (the ``builds_for`` names of ``hrm_deploy.registry.BACKENDS``).",
    )


class CalibMethod(str, Enum):
    """INT8 calibration method (``hrm_deploy.precision.calibrate.METHODS``)."""

    MINMAX = "minmax"
    ENTROPY = "entropy"
    PERCENTILE = "percentile"


class ExportMode(str, Enum):
    """ONNX graph kind (``hrm_deploy.export.onnx_export.MODES``)."""

    UNROLLED = "unrolled"
    STEP = "step"
    LOOP = "loop"


class PuzzleEmb(str, Enum):
    """Where an export keeps the puzzle-embedding table (``hrm_deploy.puzzle_table.Placement``)."""

    EMBEDDED = "embedded"
    EXTERNAL = "external"


class Provider(str, Enum):
    """ONNX Runtime execution provider (``hrm_deploy.onnx_runtime.PROVIDERS``)."""

    CPU = "cpu"
    CUDA = "cuda"
    TENSORRT = "tensorrt"


class BenchTarget(str, Enum):
    """Where ``bench`` runs (``hrm_deploy.bench.run.BENCH_TARGETS``)."""

    DESKTOP = "desktop"
    JETSON = "jetson"


class Preset(str, Enum):
    """Training preset (``hrm_deploy.train.presets.PRESETS``)."""

    SUDOKU_TINY = "sudoku-tiny"
    SUDOKU_SMALL = "sudoku-small"
    TRM_SUDOKU_SMALL = "trm-sudoku-small"
    ARC_TINY = "arc-tiny"
    SUDOKU = "sudoku"
    MAZE = "maze"


class Optimizer(str, Enum):
    """Training optimizer (``hrm_deploy.train.loop.OPTIMIZERS``)."""

    ADAM_ATAN2 = "adam_atan2"
    ADAMW = "adamw"


class Sink(str, Enum):
    """Extra training metric sink (``hrm_deploy.train.sinks.SINKS``)."""

    TENSORBOARD = "tensorboard"
    WANDB = "wandb"


class TrtAccelerator(str, Enum):
    """ONNX Runtime's TensorRT accelerator precision in a Triton repository."""

    FP16 = "fp16"
    FP32 = "fp32"
