"""What a TensorRT build is told beyond the graph: its build options (:class:`TensorRTOptions`, the
row's ``build_options``), the timing-cache file for this GPU and release, and the NVIDIA command
line (``trtexec`` / ``tensorrt_rtx``) that builds the same engine."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from hrm_deploy.backends.tensorrt.api import Backend
from hrm_deploy.engines.options import BuildOptions, Given, option
from hrm_deploy.errors import ConfigError

MAX_WORKSPACE_MIB = 1 << 20  # 1 TiB
DEFAULT_TIMING_CACHE = "engines/timing.cache"


@dataclass(frozen=True)
class TensorRTOptions(BuildOptions):
    """TensorRT / TensorRT-RTX build options; None fields take the target profile's default.
    ``timing_cache`` is a base name (the file is keyed by GPU and TensorRT version; None: no
    cache); ``allow_unrolled`` builds an unrolled graph whose estimated cost is over budget
    (:mod:`.cost`) instead of its single-step graph; ``strip_weights`` builds a weight-stripped
    engine (``STRIP_PLAN`` + ``REFIT_IDENTICAL``) that refits from its graph on first run
    (:mod:`hrm_deploy.backends.tensorrt.refit`)."""

    taker: ClassVar[str] = "TensorRT"

    workspace_mib: int | None = option(None, "--workspace", "Builder workspace limit in MiB.")
    optimization_level: int | None = option(
        None, "--opt-level", "Builder optimization level 0-5 (lower builds faster)."
    )
    compute_capability: str | None = option(
        None, "--compute-capability", "TensorRT-RTX AOT target, e.g. SM120, SM89, SM86."
    )
    allow_unrolled: bool = option(
        False,
        "--allow-unrolled",
        "TensorRT: build an unrolled graph whose estimated build is over 3 min / 4 GB (printed first); without "
        "it such a graph's single-step graph is exported and built instead.",
    )
    timing_cache: str | None = option(
        DEFAULT_TIMING_CACHE,
        "--timing-cache",
        "TensorRT timing cache base path; the GPU and the TensorRT version are added to the file name. 'none' "
        "builds without one.",
        parse=lambda text: None if text.lower() in ("", "none") else text,
    )
    strip_weights: bool = option(
        False,
        "--strip-weights",
        "TensorRT: a weight-stripped engine (STRIP_PLAN + REFIT_IDENTICAL, a fraction of the size): the runner "
        "refits it from its ONNX graph (sha256-checked) on first run and saves it whole. Needs a GPU to build "
        "(the board, or a GPU machine with the same TensorRT).",
    )

    def __post_init__(self) -> None:
        if self.workspace_mib is not None and not 16 <= self.workspace_mib <= MAX_WORKSPACE_MIB:
            raise ConfigError(f"--workspace must be between 16 and {MAX_WORKSPACE_MIB} MiB, got {self.workspace_mib}")
        if self.optimization_level is not None and not 0 <= self.optimization_level <= 5:
            raise ConfigError(
                f"--opt-level must be between 0 and 5 (TensorRT's builder levels), got {self.optimization_level}"
            )

    @classmethod
    def refuse(cls, given: list[Given], target: str, receiver: type[BuildOptions]) -> str:
        many = len(given) > 1
        return f"{', '.join(g.flag for g in given)}: TensorRT build option{'s' if many else ''}; {receiver.declines}: drop them"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower() or "unknown"


def timing_cache_path(base: str | Path, backend: Backend, gpu: dict[str, str]) -> Path:
    """``engines/timing.cache`` -> ``engines/timing.<gpu>-sm<cc>.<backend>-<version>.cache``.

    A timing cache is valid only for one GPU and one TensorRT release (``set_timing_cache``
    returns False otherwise), so the file name carries both and machines never overwrite each
    other's caches. ``gpu`` is ``hrm_deploy.system.nvidia_smi(IDENTITY)`` ({} without a GPU).
    """
    base = Path(base)
    cc = gpu.get("compute_capability", "").replace(".", "")
    key = f"{_slug(gpu.get('gpu', 'nogpu'))}{'-sm' + cc if cc else ''}.{backend.name}-{backend.version}"
    return base.with_name(f"{base.stem}.{key}{base.suffix or '.cache'}")


def _shape_arg(shapes: dict[str, list[list[int]]], which: int) -> str:
    return ",".join(f"{name}:{'x'.join(str(d) for d in dims[which])}" for name, dims in shapes.items())


def reproduce_command(
    backend: Backend,
    *,
    onnx: str | Path,
    engine: str | Path,
    shapes: dict[str, list[list[int]]],
    workspace_mib: int,
    optimization_level: int,
    compute_capability: str | None = None,
    timing_cache: str | Path | None = None,
    strip_weights: bool = False,
) -> str:
    """The ``trtexec`` (TensorRT) or ``tensorrt_rtx`` (TensorRT-RTX) line that builds the same engine.

    Flags as documented for each tool: ``--onnx --saveEngine --minShapes/--optShapes/--maxShapes
    --memPoolSize=workspace:<N>M --profilingVerbosity=detailed --skipInference``; TensorRT adds
    ``--builderOptimizationLevel``, ``--timingCacheFile``, ``--stripWeights`` for a weight-stripped
    engine and, on 10.x only, ``--stronglyTyped``
    (TensorRT 11 networks are always strongly typed and the flag is a no-op); TensorRT-RTX adds
    ``--computeCapabilities=120`` for an AOT target (none: the portable default).
    """
    tool = "tensorrt_rtx" if backend.is_rtx else "trtexec"
    args = [
        tool,
        f"--onnx={onnx}",
        f"--saveEngine={engine}",
        f"--minShapes={_shape_arg(shapes, 0)}",
        f"--optShapes={_shape_arg(shapes, 1)}",
        f"--maxShapes={_shape_arg(shapes, 2)}",
        f"--memPoolSize=workspace:{int(workspace_mib)}M",
    ]
    if backend.is_rtx:
        cc = (compute_capability or "").upper()
        if cc.startswith("SM") and cc[2:].isdigit():
            args.append(f"--computeCapabilities={cc[2:]}")
        elif cc == "CURRENT":
            args.append("--useGpu")
    else:
        if backend.major < 11:
            args.append("--stronglyTyped")
        args.append(f"--builderOptimizationLevel={int(optimization_level)}")
        if strip_weights:  # STRIP_PLAN + REFIT_IDENTICAL (trtexec's default refit mode for stripped plans)
            args.append("--stripWeights")
    args.append("--profilingVerbosity=detailed")
    if timing_cache and not backend.is_rtx:
        args.append(f"--timingCacheFile={timing_cache}")
    args.append("--skipInference")
    return shlex.join(args)
