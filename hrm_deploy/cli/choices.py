"""The fixed choices the commands offer, as Enums so ``--help`` lists them and Typer refuses
anything else in one line. The library takes plain strings: commands pass ``.value``.

The library modules that define these choices import torch or ONNX, so the command line keeps
its own light copy; tests/cli/test_choices.py checks each against the library's."""

from __future__ import annotations

from enum import Enum


class Precision(str, Enum):
    """Engine precision (``hrm_deploy.engines.build.ENGINE_PRECISIONS``)."""

    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"
    FP8 = "fp8"
    NVFP4 = "nvfp4"
    FP32 = "fp32"


class Target(str, Enum):
    """Build target (``hrm_deploy.engines.targets.TARGETS``)."""

    DESKTOP = "desktop"
    JETSON_ORIN_8GB = "jetson-orin-8gb"
    DATACENTER = "datacenter"
    CPU = "cpu"


class CpuInt8Recipe(str, Enum):
    """INT8 recipe of the cpu target (``hrm_deploy.backends.ort.builder.int8.RECIPES``)."""

    STATIC = "static"
    DYNAMIC = "dynamic"
    BLOCKWISE = "blockwise"


class Backend(str, Enum):
    """Engine builder (the ``builds_for`` names of ``hrm_deploy.registry.BACKENDS``, less the cpu target's)."""

    TENSORRT = "tensorrt"
    TENSORRT_RTX = "tensorrt-rtx"
    TORCH = "torch"


class CalibMethod(str, Enum):
    """INT8 calibration method (``hrm_deploy.precision.calibrate.METHODS``)."""

    MINMAX = "minmax"
    ENTROPY = "entropy"
    PERCENTILE = "percentile"


class ExportMode(str, Enum):
    """ONNX graph kind (``hrm_deploy.export.onnx_export.MODES``)."""

    UNROLLED = "unrolled"
    STEP = "step"


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
