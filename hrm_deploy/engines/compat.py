"""Before deserializing an engine: does it fit the TensorRT and GPU running now? The raw
TensorRT deserialization error is cryptic; this one names both sides."""

from __future__ import annotations

from typing import Any

from hrm_deploy.errors import EngineError


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def check_compatible(manifest: dict[str, Any], backend_name: str, backend_version: str,
                     gpu_capability: tuple[int, int] | None, gpu_name: str | None) -> None:
    built = manifest.get("backend", {})
    if built.get("name") != backend_name:
        raise EngineError(f"this engine was built with {built.get('name')} but {backend_name} is loading it; "
                          f"run it with {built.get('name')} or rebuild it with hrm-deploy build-engine --backend {backend_name}")
    if _major_minor(str(built.get("version", ""))) != _major_minor(backend_version):
        raise EngineError(f"this engine was built with {backend_name} {built.get('version')} but {backend_version} "
                          "is installed; rebuild it here with hrm-deploy build-engine")
    if gpu_capability is None:
        return
    running = f"{gpu_capability[0]}.{gpu_capability[1]}"
    target_cc = manifest.get("compute_capability")  # RTX AOT target, "SM120"
    if backend_name == "tensorrt-rtx" and target_cc and target_cc.startswith("SM"):
        wanted = f"{target_cc[2:-1]}.{target_cc[-1]}"
        if wanted != running:
            raise EngineError(f"this engine targets compute capability {wanted} ({target_cc}) but the GPU here "
                              f"({gpu_name}) is {running}; rebuild with --compute-capability SM{running.replace('.', '')}")
        return
    built_cc = manifest.get("build_machine", {}).get("compute_capability")
    if built_cc and built_cc != running:
        raise EngineError(f"this engine was built on a GPU of compute capability {built_cc} "
                          f"({manifest['build_machine'].get('gpu')}) but this GPU ({gpu_name}) is {running}; "
                          "TensorRT engines are specific to a GPU: rebuild it on this machine")
