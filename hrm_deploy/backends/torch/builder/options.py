"""The torch backend's build options (its row's ``build_options``): the device to compile for, whether
float32 CUDA matmuls may use TF32, what to compile (mode, steps) and with which compiler, each
checked here; refused in one line elsewhere."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hrm_deploy.engines.options import BuildOptions, Given, option
from hrm_deploy.errors import ConfigError

if TYPE_CHECKING:
    from hrm_deploy.engines.config import EngineConfig

TORCH_PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}  # engine precision -> the model's forward dtype
TORCH_MODES = ("step", "unrolled", "loop")
COMPILERS = ("auto", "aoti", "torch.compile")
DEFAULT_MAX_BATCH = 1024  # the largest batch of a package built without --max-batch


def check_torch_precision(precision: str) -> None:
    """The torch backend compiles the model at fp32 or bf16 only."""
    if precision not in TORCH_PRECISIONS:
        raise ConfigError(
            f"the torch backend builds {' or '.join(TORCH_PRECISIONS)}, not {precision}; pass --fp32 or --bf16"
        )


def check_device(device: str) -> None:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    if device not in ("auto", "cpu", "cuda") and not re.fullmatch(r"cuda:\d+", device):
        raise ConfigError(f"device {device!r}: use auto, cpu, cuda or cuda:N")


@dataclass(frozen=True)
class TorchOptions(BuildOptions):
    """``device``: compile for ``cuda`` (``cuda:N``), ``cpu`` or ``auto`` (cuda when torch sees a GPU);
    ``tf32``: float32 CUDA matmuls may use TF32 (default: exact float32; recorded in the manifest);
    ``mode`` and ``steps``: what to compile (None: the export's, or the single step and the checkpoint's
    ``halt_max_steps`` for a checkpoint); ``compiler``: AOTInductor (``aoti``), the exported program
    for the runner to ``torch.compile`` at load, or ``auto`` (AOTInductor where it can compile)."""

    taker: ClassVar[str] = "--backend torch"
    batch: ClassVar[tuple[str, ...]] = ("max_batch",)  # the largest batch of the compiled package
    declines: ClassVar[str] = "--backend torch compiles for this machine and reads only --max-batch"

    device: str = option(
        "auto", "--device", "torch backend: compile for auto (cuda when torch sees a GPU), cpu, cuda or cuda:N."
    )
    tf32: bool = option(
        False,
        "--tf32",
        "torch backend, fp32 on CUDA: let float32 matmuls use TF32 (faster, about 1e-3 relative error); default "
        "exact float32. Recorded in the manifest.",
        note="TensorRT engines take their precision from the ONNX",
    )
    mode: str | None = option(
        None,
        "--mode",
        "torch backend: compile the single step (step), the whole unroll (unrolled) or the ACT loop (loop); "
        "default: an export's own mode, step for a checkpoint.",
        choices=TORCH_MODES,
    )
    steps: int | None = option(
        None,
        "--steps",
        "torch backend, unrolled or loop: the step count (default: the export's, or the checkpoint's halt_max_steps).",
    )
    compiler: str = option(
        "auto",
        "--compiler",
        "torch backend: aoti (an AOTInductor package; refused where this machine cannot compile one), "
        "torch.compile (the exported program, compiled by the runner at load) or auto (aoti where it compiles, "
        "else torch.compile; the manifest's compile_path says which).",
        choices=COMPILERS,
    )

    def __post_init__(self) -> None:
        check_device(self.device)
        if self.mode is not None and self.mode not in TORCH_MODES:
            raise ConfigError(f"--mode {self.mode}: use {', '.join(TORCH_MODES)}")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"--steps must be >= 1, got {self.steps}")
        if self.compiler not in COMPILERS:
            raise ConfigError(f"--compiler {self.compiler}: use one of {', '.join(COMPILERS)}")

    def check(self, config: EngineConfig) -> None:
        check_torch_precision(config.precision)
        if config.max_batch is not None and config.max_batch < 2:
            raise ConfigError(
                f"--max-batch of a torch engine must be >= 2 (its batch is dynamic), got {config.max_batch}"
            )

    @classmethod
    def refuse(cls, given: list[Given], target: str, receiver: type[BuildOptions]) -> str:
        note = given[0].note
        return f"{given[0].shown} is an option of --backend torch; drop it" + (f" ({note})" if note else "")
