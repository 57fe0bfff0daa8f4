"""The torch backend's build options (its row's ``build_options``): the device to compile for and
whether float32 CUDA matmuls may use TF32, each checked here; refused in one line elsewhere."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hrm_deploy.engines.options import BuildOptions, Given, option
from hrm_deploy.errors import ConfigError

if TYPE_CHECKING:
    from hrm_deploy.engines.build import EngineConfig

TORCH_PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}  # engine precision -> the model's forward dtype


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
    """``device``: compile for ``cuda``, ``cpu`` or ``auto`` (cuda when torch sees a GPU; the Python
    API sets it, ``build-engine`` compiles for ``auto``); ``tf32``: float32 CUDA matmuls may use TF32
    (default: exact float32; recorded in the manifest)."""

    taker: ClassVar[str] = "--backend torch"
    batch: ClassVar[tuple[str, ...]] = ("max_batch",)  # the largest batch of the compiled package
    declines: ClassVar[str] = "--backend torch compiles for this machine and reads only --max-batch"

    device: str = option("auto", None)  # no flag: build-engine compiles for this machine
    tf32: bool = option(False, "--tf32", "TensorRT engines take their precision from the ONNX")

    def __post_init__(self) -> None:
        check_device(self.device)

    def check(self, config: EngineConfig) -> None:
        check_torch_precision(config.precision)

    @classmethod
    def refuse(cls, given: list[Given], target: str, receiver: type[BuildOptions]) -> str:
        note = given[0].note
        return f"{given[0].shown} is an option of --backend torch; drop it" + (f" ({note})" if note else "")
