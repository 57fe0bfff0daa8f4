"""The cpu target's build options (its row's ``build_options``): ONNX Runtime's threads, the fusions,
the INT8 recipe and static INT8's activation type, each checked here (and, against the common
fields, which precisions the cpu target builds and which options only static INT8 reads); refused
in one line for any other target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from hrm_deploy.engines.options import BuildOptions, Given, option
from hrm_deploy.errors import ConfigError
from hrm_deploy.precision.registry import PRECISIONS

if TYPE_CHECKING:
    from hrm_deploy.engines.config import EngineConfig

CPU_PRECISIONS = ("fp32", "fp16", "int8")
# the INT8 recipes (int8.RECIPES describes each) and static INT8's activation types (isa.py)
INT8_RECIPES = ("static", "dynamic", "blockwise")
ACTIVATIONS = ("auto", "uint8", "int8")


@dataclass(frozen=True)
class CpuOptions(BuildOptions):
    """``threads``: ONNX Runtime intra-op threads (None: one per core), and the streams the build's
    accuracy check measures on (:mod:`hrm_deploy.streams`); ``fuse``: attention and
    RMSNorm into ORT's fused CPU kernels; ``int8_recipe``: the INT8 recipe (None: static);
    ``activations``: static INT8's activation type (auto: this CPU's ISA decides, ``isa.py``)."""

    taker: ClassVar[str] = "--target cpu"
    batch: ClassVar[tuple[str, ...]] = ()  # ONNX Runtime runs any batch: no profile to build
    declines: ClassVar[str] = "the cpu target runs any batch and has no builder to tune"

    threads: int | None = option(
        None,
        "--threads",
        "cpu target: ONNX Runtime intra-op threads (default: one per core); the build's accuracy check runs as many "
        "single-thread streams.",
    )
    fuse: bool = option(
        True,
        "--no-fuse",
        "cpu target: leave attention and RMSNorm as ONNX Runtime's optimizer leaves them (by default they become "
        "its fused CPU kernels, each fused block checked).",
    )
    int8_recipe: str | None = option(
        None,
        "--cpu-int8",
        "cpu target INT8 recipe. static (default): scales fixed by calibration, answers independent of "
        "batching, kept within --accuracy-budget. dynamic: no calibration, fastest at batch > 1, but an answer "
        "can depend on its batch-mates. blockwise: no calibration, batch-independent, slower than FP32 on "
        "small models.",
        choices=INT8_RECIPES,
    )
    activations: str = option(
        "auto",
        "--cpu-int8-activations",
        "cpu target, static INT8: the integer GEMM's activations, uint8 (U8S8: AVX2 and VNNI's native form) or "
        "int8 (S8S8: AMX's); auto: this CPU's ISA decides. The manifest records the choice and the ISA.",
        choices=ACTIVATIONS,
    )

    def __post_init__(self) -> None:
        from hrm_deploy.system import check_threads

        check_threads(self.threads)
        if self.int8_recipe is not None and self.int8_recipe not in INT8_RECIPES:
            raise ConfigError(f"the cpu INT8 recipe is one of {', '.join(INT8_RECIPES)}, not {self.int8_recipe}")
        if self.activations not in ACTIVATIONS:
            raise ConfigError(f"static INT8 activations are one of {', '.join(ACTIVATIONS)}, not {self.activations}")

    @property
    def recipe(self) -> str:
        """The INT8 recipe a build uses (static unless another was asked for)."""
        return self.int8_recipe or "static"

    def check(self, config: EngineConfig) -> None:
        """A precision the cpu target builds; an INT8 recipe only with --int8; the calibration and
        accuracy options only where static INT8 reads them."""
        need_gpu = PRECISIONS[config.precision].min_capability
        if need_gpu:
            need = "{}.{}".format(*need_gpu)
            raise ConfigError(
                f"{config.precision} engines need a GPU of compute capability >= {need} (TensorRT); for the cpu "
                f"target use --int8 or --fp32 ({config.precision.upper()} accuracy is measured on CPU by "
                f"benchmarks/{config.precision}_accuracy.py)"
            )
        if config.precision not in CPU_PRECISIONS:
            raise ConfigError(
                f"the cpu target builds {', '.join(CPU_PRECISIONS)}, not {config.precision}; BF16 needs a GPU"
            )
        if self.int8_recipe is not None and config.precision != "int8":
            raise ConfigError(
                f"--cpu-int8 {self.int8_recipe} chooses the INT8 recipe; add --int8 (got {config.precision})"
            )
        self._check_static(config)

    def _check_static(self, config: EngineConfig) -> None:
        """Only the static INT8 recipe calibrates and measures accuracy."""
        if config.precision == "int8" and self.recipe == "static":
            return
        given = [
            flag
            for flag, on in (
                ("--calib-data", config.calib_data is not None),
                ("--calib-method", config.calib_method != "minmax"),
                ("--calib-samples", config.calib_samples is not None),
                ("--accuracy-budget", config.accuracy_budget is not None),
                ("--no-accuracy-check", not config.accuracy_check),
                ("--cpu-int8-activations", self.activations != "auto"),
            )
            if on
        ]
        if given:
            what = f"--cpu-int8 {self.recipe}" if config.precision == "int8" else config.precision.upper()
            raise ConfigError(
                f"{', '.join(given)}: only the static INT8 recipe calibrates and measures accuracy on the cpu target, "
                f"{what} takes no data; drop {'them' if len(given) > 1 else 'it'} or build --int8 --cpu-int8 static"
            )

    @classmethod
    def refuse(cls, given: list[Given], target: str, receiver: type[BuildOptions]) -> str:
        return f"{given[0].shown} is an option of --target cpu; {receiver.taker} does not take it"
