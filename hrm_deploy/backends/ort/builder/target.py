"""``build-engine --target cpu``: the build stage's entry into the cpu target's build (:mod:`.cpu`).

:data:`BUILDER` takes the FP32 export (the cpu target writes its own precision: integer GEMMs,
FP16 with float32 islands); its options are a :class:`~.options.CpuOptions`, checked (and refused
for other targets) by ``EngineConfig``."""

from __future__ import annotations

from hrm_deploy.engines.request import BuildRequest, GraphInput, SimpleBuilder
from hrm_deploy.engines.result import EngineResult


def build_for_cpu(request: BuildRequest) -> EngineResult:
    """The cpu target's build of ``request.ready`` as its ``EngineConfig`` says (its options a
    ``CpuOptions``). Returns the ``EngineResult``."""
    from hrm_deploy.backends.ort.builder.cpu import build_cpu

    built = build_cpu(request.ready, request.config, request.out, request.quiet, model=request.model)
    return EngineResult(built.path, built.manifest, built.source_onnx, built.build)


def _build(request: BuildRequest) -> EngineResult:
    return build_for_cpu(request)  # looked up at call time (tests replace it)


BUILDER = SimpleBuilder(_build, GraphInput.FP32)
