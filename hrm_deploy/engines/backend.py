"""TensorRT and TensorRT-RTX behind one small interface: the APIs match closely, and every
difference between them lives here.

- strong typing: the ``STRONGLY_TYPED`` network flag on TensorRT 10.x; the default (flag
  ignored) on TensorRT 11 and the only mode on RTX;
- timing cache: TensorRT only (a no-op on RTX);
- ahead-of-time compute-capability targets: RTX only (``set_compute_capability``);
- runtime cache of JIT kernels: RTX only (used by the runtime, not the builder).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from hrm_deploy.errors import ConfigError, DependencyError

MODULES = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}
EXTRAS = {"tensorrt": "trt", "tensorrt-rtx": "rtx"}


@dataclass
class Backend:
    name: str  # "tensorrt" or "tensorrt-rtx"
    trt: Any  # the imported module (typed as Any: the two modules share an API, not a type)

    @property
    def version(self) -> str:
        return str(getattr(self.trt, "__version__", "unknown"))

    @property
    def is_rtx(self) -> bool:
        return self.name == "tensorrt-rtx"

    @property
    def major(self) -> int:
        try:
            return int(self.version.split(".")[0])
        except ValueError:
            return 0

    def network_flags(self) -> int:
        flag = getattr(self.trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
        if flag is None or (not self.is_rtx and self.major >= 11):
            return 0  # TensorRT 11: every network is strongly typed; the flag is ignored
        return 1 << int(flag)

    def supports_timing_cache(self) -> bool:
        return not self.is_rtx

    def compute_capability(self, target: str | None) -> Any:
        """The RTX ComputeCapability member for ``target`` ("SM120"), checked; None elsewhere."""
        if not self.is_rtx or not target:
            return None
        members = self.trt.ComputeCapability.__members__
        if target not in members:
            raise ConfigError(f"compute capability {target} is not one TensorRT-RTX {self.version} builds for; "
                              f"choose one of {', '.join(k for k in members if k.startswith('SM'))}")
        return members[target]

    def set_compute_capability(self, config: Any, target: str | None) -> None:
        member = self.compute_capability(target)
        if member is not None:
            config.num_compute_capabilities = 1
            config.set_compute_capability(member, 0)


def load_backend(name: str) -> Backend:
    """Import the backend's Python module or raise one clear error naming the extra to install."""
    if name not in MODULES:
        raise ConfigError(f"unknown backend {name!r}; use tensorrt or tensorrt-rtx")
    try:
        module: ModuleType = importlib.import_module(MODULES[name])
    except ImportError as exc:
        raise DependencyError(f"the {name} backend needs the Python package {MODULES[name]} ({exc}); install it with "
                              f"pip install 'hrm-deploy[{EXTRAS[name]}]' (on Jetson: JetPack's TensorRT, see jetson/)") from None
    if not hasattr(module, "Builder"):
        # tensorrt-stubs alone makes `import tensorrt` succeed with no library behind it
        raise DependencyError(f"{MODULES[name]} is importable but has no Builder (type stubs only?); install the real "
                              f"package: pip install 'hrm-deploy[{EXTRAS[name]}]'")
    return Backend(name, module)
