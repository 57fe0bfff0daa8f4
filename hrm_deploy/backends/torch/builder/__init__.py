"""The torch backend's build side: ``build-engine --backend torch``.

- :mod:`.options`: ``TorchOptions``, its build options (device, TF32, mode, steps, compiler) and their checks;
- :mod:`.engine`: ``BUILDER`` (preflight, build, publish) and ``build_torch_engine``, the same from
  Python, both reading an ``EngineConfig`` with ``TorchOptions``;
- :mod:`.compile`: the work steps: ``torch.export`` of a mode, the AOTInductor compile (or the saved
  program for ``torch.compile``), the fresh-process load check, the engine's I/O.
"""

from hrm_deploy.backends.torch.builder.compile import io_specs
from hrm_deploy.backends.torch.builder.engine import BUILDER, build_torch_engine
from hrm_deploy.backends.torch.builder.options import TorchOptions

__all__ = ["BUILDER", "TorchOptions", "build_torch_engine", "io_specs"]
