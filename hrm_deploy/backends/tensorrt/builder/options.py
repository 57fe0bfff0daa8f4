"""What a TensorRT build is told beyond the graph: the timing-cache file for this GPU and release,
and the NVIDIA command line (``trtexec`` / ``tensorrt_rtx``) that builds the same engine."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from hrm_deploy.backends.tensorrt.api import Backend


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
) -> str:
    """The ``trtexec`` (TensorRT) or ``tensorrt_rtx`` (TensorRT-RTX) line that builds the same engine.

    Flags as documented for each tool: ``--onnx --saveEngine --minShapes/--optShapes/--maxShapes
    --memPoolSize=workspace:<N>M --profilingVerbosity=detailed --skipInference``; TensorRT adds
    ``--builderOptimizationLevel``, ``--timingCacheFile`` and, on 10.x only, ``--stronglyTyped``
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
    args.append("--profilingVerbosity=detailed")
    if timing_cache and not backend.is_rtx:
        args.append(f"--timingCacheFile={timing_cache}")
    args.append("--skipInference")
    return shlex.join(args)
