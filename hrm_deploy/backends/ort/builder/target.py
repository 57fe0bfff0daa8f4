"""``build-engine --target cpu``: the build stage's entry into the cpu target's build (:mod:`.cpu`).

:data:`BUILDER` takes the FP32 export (the cpu target writes its own precision: integer GEMMs,
FP16 with float32 islands); its options are a :class:`~.options.CpuOptions`, checked (and refused
for other targets) by ``EngineConfig``."""

from __future__ import annotations

from hrm_deploy.engines.request import BuildRequest, GraphInput, SimpleBuilder
from hrm_deploy.engines.result import EngineResult


def build_for_cpu(request: BuildRequest) -> EngineResult:
    """The build stage's options (an ``EngineConfig``) on the cpu target: its options' ``int8_recipe``
    is the INT8 recipe asked for (None: ``static``); ``config.accuracy_check`` False skips static
    INT8's comparison with FP32. Returns the ``EngineResult``."""
    from hrm_deploy.backends.ort.builder.cpu import CpuBuildConfig, build_cpu
    from hrm_deploy.backends.ort.builder.options import CpuOptions

    config = request.config
    options = config.options_as(CpuOptions)
    cpu = CpuBuildConfig(
        config.precision,
        options.threads,
        fuse=options.fuse,
        int8_recipe=options.int8_recipe or "static",
        calib_data=config.calib_data,
        calib_method=config.calib_method,
        calib_samples=config.calib_samples,
        accuracy_budget=config.accuracy_budget,
        check_accuracy=config.accuracy_check,
    )
    built = build_cpu(request.ready, cpu, request.out, request.quiet, model=request.model)
    return EngineResult(built.path, built.manifest, built.source_onnx, built.build)


def _build(request: BuildRequest) -> EngineResult:
    return build_for_cpu(request)  # looked up at call time (tests replace it)


BUILDER = SimpleBuilder(_build, GraphInput.FP32)
