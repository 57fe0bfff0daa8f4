"""Before deserializing an engine: does it fit the TensorRT and GPU running now? The raw
TensorRT deserialization error is cryptic; this one names both sides.

- TensorRT: an engine loads only in the TensorRT release that built it, patch level included
  (10.3.0 and 10.3.1 reject each other's engines), and on a GPU of the build GPU's compute
  capability; another GPU model of that capability loads it but was not tuned on (a warning).
- TensorRT-RTX: releases are mutually incompatible (1.7.0 vs 1.7.1). Where the runtime has
  ``Runtime.get_engine_validity`` (RTX 1.x) and the engine bytes are at hand, the runtime
  itself decides, naming its diagnostics. Otherwise the versions must match exactly and the
  GPU must be the AOT target (``--compute-capability SM120``) or, for an engine built without
  one, one of the capabilities a portable RTX engine runs on.
"""

from __future__ import annotations

from typing import Any

from hrm_deploy.errors import EngineError

# Compute capabilities a TensorRT-RTX engine built without an SM target runs on (TensorRT-RTX
# 1.x docs, "CPU-only AOT": Ampere and later RTX GPUs; Turing 7.5 only when targeted explicitly).
RTX_PORTABLE_CAPABILITIES = ((8, 0), (8, 6), (8, 9), (12, 0), (12, 1))

_DIAGNOSTICS = {
    1: "TensorRT-RTX version mismatch",
    2: "unsupported compute capability",
    4: "CUDA driver too old",
    8: "CUDA runtime too old",
    16: "not enough GPU memory",
    32: "malformed engine",
    64: "CUDA error",
}


def _release(version: str) -> tuple[str, ...]:
    """major.minor.patch (TensorRT compares these; a 4th field is the build number)."""
    return tuple(str(version).split(".")[:3])


def _sm_to_capability(target: str) -> tuple[int, int] | None:
    """ "SM120" -> (12, 0), "SM86" -> (8, 6); None for NONE/CURRENT/unknown."""
    if not target.startswith("SM") or not target[2:].isdigit() or len(target) < 4:
        return None
    return int(target[2:-1]), int(target[-1])


def _describe(diagnostics: int) -> str:
    names = [text for bit, text in _DIAGNOSTICS.items() if int(diagnostics) & bit]
    return ", ".join(names) or f"diagnostics {int(diagnostics)}"


def _rtx_validity(runtime: Any, engine_bytes: bytes, backend_version: str, gpu_name: str | None) -> list[str] | None:
    """Ask the RTX runtime; None when it cannot tell (no such API)."""
    check = getattr(runtime, "get_engine_validity", None)
    if check is None:
        return None
    validity, diagnostics = check(engine_bytes)
    verdict = getattr(validity, "name", str(validity)).split(".")[-1].upper()
    if verdict == "VALID":
        return []
    if verdict == "SUBOPTIMAL":
        return [
            (
                f"TensorRT-RTX {backend_version} reports this engine as suboptimal on {gpu_name or 'this GPU'} "
                f"({_describe(diagnostics)}); rebuilding it here may be faster"
            )
        ]
    raise EngineError(
        f"TensorRT-RTX {backend_version} cannot run this engine on {gpu_name or 'this GPU'}: "
        f"{_describe(diagnostics)}; rebuild it with this TensorRT-RTX: hrm-deploy build-engine "
        "--backend tensorrt-rtx"
    )


def check_compatible(
    manifest: dict[str, Any],
    backend_name: str,
    backend_version: str,
    gpu_capability: tuple[int, int] | None,
    gpu_name: str | None,
    *,
    engine_bytes: bytes | None = None,
    runtime: Any = None,
) -> list[str]:
    """Raise one :class:`EngineError` when the engine cannot load here; return warnings otherwise.

    ``runtime`` is the backend's ``Runtime`` object and ``engine_bytes`` the serialized engine:
    given both, TensorRT-RTX's ``get_engine_validity`` decides (when a GPU is present).
    """
    built = manifest.get("backend", {})
    built_name, built_version = built.get("name"), str(built.get("version", ""))
    if built_name != backend_name:
        raise EngineError(
            f"this engine was built with {built_name} but {backend_name} is loading it; "
            f"run it with {built_name} or rebuild it with hrm-deploy build-engine --backend {backend_name}"
        )
    rtx = backend_name == "tensorrt-rtx"
    if rtx and gpu_capability is not None and engine_bytes is not None and runtime is not None:
        verdict = _rtx_validity(runtime, engine_bytes, backend_version, gpu_name)
        if verdict is not None:
            return verdict
    warnings: list[str] = []
    if _release(built_version) != _release(backend_version):
        raise EngineError(
            f"this engine was built with {backend_name} {built_version} but {backend_version} is "
            f"installed ({backend_name} loads only engines of its own release, patch level included); "
            "rebuild it here with hrm-deploy build-engine"
        )
    if built_version != backend_version:
        warnings.append(
            f"engine built with {backend_name} {built_version}, running {backend_version} "
            "(same release, another build number)"
        )
    if gpu_capability is None:
        return warnings
    running = f"{gpu_capability[0]}.{gpu_capability[1]}"
    build_machine = manifest.get("build_machine") or {}
    if rtx:
        target = str(manifest.get("compute_capability") or "")
        wanted = _sm_to_capability(target)
        if wanted is not None:
            if tuple(wanted) != tuple(gpu_capability):
                raise EngineError(
                    f"this engine targets compute capability {wanted[0]}.{wanted[1]} ({target}) but the "
                    f"GPU here ({gpu_name}) is {running}; rebuild with --compute-capability "
                    f"SM{running.replace('.', '')}"
                )
            return warnings
        if target.upper() != "CURRENT":  # portable AOT engine: not pinned to the build machine
            if tuple(gpu_capability) not in RTX_PORTABLE_CAPABILITIES:
                supported = ", ".join(f"{a}.{b}" for a, b in RTX_PORTABLE_CAPABILITIES)
                raise EngineError(
                    f"a portable TensorRT-RTX engine runs on compute capability {supported}, but the "
                    f"GPU here ({gpu_name}) is {running}; rebuild with --compute-capability "
                    f"SM{running.replace('.', '')}"
                )
            return warnings
    built_cc = build_machine.get("compute_capability")
    if built_cc and built_cc != running:
        raise EngineError(
            f"this engine was built on a GPU of compute capability {built_cc} "
            f"({build_machine.get('gpu')}) but this GPU ({gpu_name}) is {running}; "
            "TensorRT engines are specific to a GPU: rebuild it on this machine"
        )
    built_gpu = build_machine.get("gpu")
    if built_cc and built_gpu and gpu_name and built_gpu != gpu_name:
        warnings.append(
            f"engine built on {built_gpu}, running on {gpu_name} (same compute capability {running}); "
            "it loads, but its kernels were timed on the other GPU: rebuild here for best speed"
        )
    return warnings
