"""The cpu target's build options (its row's ``build_options``): ONNX Runtime's threads, the fusions
and the INT8 recipe, each checked here; refused in one line for any other target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hrm_deploy.engines.options import BuildOptions, Given, option
from hrm_deploy.errors import ConfigError
from hrm_deploy.precision.registry import PRECISIONS

if TYPE_CHECKING:
    from hrm_deploy.engines.build import EngineConfig


@dataclass(frozen=True)
class CpuOptions(BuildOptions):
    """``threads``: ONNX Runtime intra-op threads (None: one per core); ``fuse``: attention and
    RMSNorm into ORT's fused CPU kernels; ``int8_recipe``: the INT8 recipe (``int8.RECIPES``;
    None: static)."""

    taker: ClassVar[str] = "--target cpu"
    batch: ClassVar[tuple[str, ...]] = ()  # ONNX Runtime runs any batch: no profile to build
    declines: ClassVar[str] = "the cpu target runs any batch and has no builder to tune"

    threads: int | None = option(None, "--threads")
    fuse: bool = option(True, "--no-fuse")
    int8_recipe: str | None = option(None, "--cpu-int8")

    def __post_init__(self) -> None:
        from hrm_deploy.system import check_threads

        check_threads(self.threads)

    def check(self, config: EngineConfig) -> None:
        """No GPU-only precision; an INT8 recipe only with --int8."""
        need_gpu = PRECISIONS[config.precision].min_capability
        if need_gpu:
            need = "{}.{}".format(*need_gpu)
            raise ConfigError(
                f"{config.precision} engines need a GPU of compute capability >= {need} (TensorRT); for the cpu "
                f"target use --int8 or --fp32 ({config.precision.upper()} accuracy is measured on CPU by "
                f"benchmarks/{config.precision}_accuracy.py)"
            )
        if self.int8_recipe is not None and config.precision != "int8":
            raise ConfigError(
                f"--cpu-int8 {self.int8_recipe} chooses the INT8 recipe; add --int8 (got {config.precision})"
            )

    @classmethod
    def refuse(cls, given: list[Given], target: str, receiver: type[BuildOptions]) -> str:
        return f"{given[0].shown} is an option of --target cpu; {receiver.taker} does not take it"
