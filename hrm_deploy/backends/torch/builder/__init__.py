"""The torch backend's build side: ``build-engine --backend torch``.

- :mod:`.options`: ``TorchOptions``, its build options (device, TF32) and their checks;
- :mod:`.engine`: ``BUILDER`` (preflight, build, publish) and ``build_torch_engine`` with the full
  ``TorchEngineConfig`` (mode, steps, compiler);
- :mod:`.compile`: the work steps: ``torch.export`` of a mode, the AOTInductor compile (or the saved
  program for ``torch.compile``), the fresh-process load check, the engine's I/O.
"""

from hrm_deploy.backends.torch.builder.compile import io_specs
from hrm_deploy.backends.torch.builder.engine import BUILDER, TorchEngineConfig, build_torch_engine
from hrm_deploy.backends.torch.builder.options import TorchOptions

__all__ = ["BUILDER", "TorchEngineConfig", "TorchOptions", "build_torch_engine", "io_specs"]
