"""TensorRT and TensorRT-RTX behind one small interface: the APIs match closely, and every
difference between them lives here. The builder (:mod:`.builder`) and the runner (:mod:`.runner`)
both use it; it imports only the base, so the light on-device path stays light.

- strong typing: the ``STRONGLY_TYPED`` network flag on TensorRT 10.x; the default (flag
  ignored) on TensorRT 11 and the only mode on RTX;
- timing cache: TensorRT only (a no-op on RTX);
- ahead-of-time compute-capability targets: RTX only (``set_compute_capability``);
- runtime cache of JIT kernels: RTX only (used by the runtime, not the builder):
  :func:`create_context` loads and saves it beside the engine;
- reproducing a build with NVIDIA's own tool: see :mod:`.builder.options`.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from hrm_deploy.errors import ConfigError, DependencyError, install_hint
from hrm_deploy.io import atomic_path

log = logging.getLogger(__name__)

MODULES = {"tensorrt": "tensorrt", "tensorrt-rtx": "tensorrt_rtx"}
EXTRAS = {"tensorrt": "trt", "tensorrt-rtx": "rtx"}


@dataclass
class Backend:
    name: str  # "tensorrt" or "tensorrt-rtx"
    # The imported module. Typed as Any at run time (the two modules share an API, not a type);
    # scripts/typecheck_tensorrt.py re-types it as the tensorrt stubs' module so attribute use is
    # checked, and tests/backends/tensorrt/test_rtx_surface.py checks every RTX-path name on tensorrt_rtx.
    trt: Any

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

    def supports_stripping(self) -> bool:
        """Weight-stripped plans (``STRIP_PLAN``, TensorRT 10.0 and later; TensorRT-RTX has it too)."""
        return hasattr(self.trt.BuilderFlag, "STRIP_PLAN")

    def compute_capability(self, target: str | None) -> Any:
        """The RTX ComputeCapability member for ``target`` ("SM120"), checked; None elsewhere."""
        if not self.is_rtx or not target:
            return None
        members = self.trt.ComputeCapability.__members__
        if target not in members:
            raise ConfigError(
                f"compute capability {target} is not one TensorRT-RTX {self.version} builds for; "
                f"choose one of {', '.join(k for k in members if k.startswith('SM'))}"
            )
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
        raise DependencyError(
            f"the {name} backend needs the Python package {MODULES[name]} ({exc}); install it with "
            f"{install_hint(EXTRAS[name])} (on Jetson: JetPack's TensorRT, see jetson/)"
        ) from None
    if not hasattr(module, "Builder"):
        # tensorrt-stubs alone makes `import tensorrt` succeed with no library behind it
        raise DependencyError(
            f"{MODULES[name]} is importable but has no Builder (type stubs only?); install the real "
            f"package: {install_hint(EXTRAS[name])}"
        )
    return Backend(name, module)


# ---------------------------------------------------------------- loading an engine

ERROR_SEVERITY = 1  # ILogger.Severity: INTERNAL_ERROR 0, ERROR 1, WARNING 2, INFO 3, VERBOSE 4


def recording_logger(trt: Any) -> Any:
    """A TensorRT logger that keeps the errors TensorRT reports (``.errors``: why it refused to
    deserialize an engine) and passes its warnings on to this module's log."""

    class Recording(trt.ILogger):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            level = int(severity)
            if level <= ERROR_SEVERITY:
                self.errors.append(str(msg).strip())
            elif level == ERROR_SEVERITY + 1:
                log.warning("%s", msg)

    return Recording()


def deserialize(backend: Backend, runtime: Any, logger: Any, blob: bytes, path: str | Path) -> Any:
    """``runtime.deserialize_cuda_engine(blob)`` (``logger``: the runtime's :func:`recording_logger`),
    or one :class:`EngineError` line naming ``path`` and TensorRT's reason: the one place an engine
    is loaded, whichever command opened it."""
    from hrm_deploy.errors import EngineError

    logger.errors.clear()
    engine = runtime.deserialize_cuda_engine(blob)
    if engine is None:
        reason = next((e for e in logger.errors if e), "it gave no reason").splitlines()[0][:300]
        raise EngineError(
            f"{backend.name} {backend.version} cannot load {path}: {reason}; rebuild it here (hrm-deploy build-engine), "
            "with the TensorRT and GPU it will run on"
        )
    return engine


# ---------------------------------------------------------------- runtime cache (TensorRT-RTX)

RUNTIME_CACHE_SUFFIX = ".runtime.cache"


def runtime_cache_path(engine_path: str | Path) -> Path:
    """``m.engine`` -> ``m.engine.runtime.cache``: TensorRT-RTX's JIT kernels for this engine."""
    engine_path = Path(engine_path)
    return engine_path.with_name(engine_path.name + RUNTIME_CACHE_SUFFIX)


@dataclass
class EngineContext:
    """An execution context plus, on TensorRT-RTX, the runtime cache it compiles kernels into.

    Keep this object alive as long as ``context``: the runtime config and cache must outlive it.
    """

    context: Any
    runtime_config: Any = None
    cache: Any = None
    cache_path: Path | None = None
    cache_loaded: bool = False
    owns_cache: bool = True  # False: another context's cache, shared (that context saves it)
    builtin_graphs: bool = False  # TensorRT-RTX captures each execute as a CUDA graph itself
    notes: list[str] = field(default_factory=list)

    def save_runtime_cache(self) -> Path | None:
        """Write the (grown) runtime cache atomically beside the engine; None where there is none
        or where this context shares another's cache (one writer per engine).

        Call after the first inferences of each batch size: that is when RTX compiles kernels.
        Saves of one folder are serialised by a lock on the folder, so two processes sharing an
        engine never interleave their writes (each file written is a whole cache).
        """
        if self.cache is None or self.cache_path is None or not self.owns_cache:
            return None
        blob = bytes(self.cache.serialize())
        with _folder_lock(self.cache_path.parent), atomic_path(self.cache_path) as tmp:
            tmp.write_bytes(blob)
        return self.cache_path


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``folder`` (flock on its descriptor: no lock file left behind)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: atomic replacement alone
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def create_context(
    engine: Any,
    backend: Backend,
    runtime_cache: str | Path | None = None,
    *,
    allocation_strategy: str | None = None,
    cuda_graphs: bool = False,
    shared: EngineContext | None = None,
) -> EngineContext:
    """Create an execution context for ``engine``; on TensorRT-RTX with a runtime cache.

    ``runtime_cache`` is the cache file (usually :func:`runtime_cache_path` of the engine). On RTX
    the context is made from an ``IRuntimeConfig`` (``engine.create_runtime_config()``) holding
    an ``IRuntimeCache`` (``config.create_runtime_cache()``), filled from the file when it exists
    and matches (``cache.deserialize(blob)`` returns False for another GPU, driver or RTX
    version: then the context starts with an empty cache and says so in ``notes``), attached with
    ``config.set_runtime_cache(cache)``, then ``engine.create_execution_context(config)``.
    ``allocation_strategy`` ("static", "on_profile_change", "user_managed") picks
    ``ExecutionContextAllocationStrategy`` (the device loop wants "user_managed" to own memory).
    ``shared``: an earlier context of the same engine whose runtime cache this one uses too (one
    cache, one writer per engine). ``cuda_graphs`` (RTX): the runtime captures each execute as a
    CUDA graph itself (``CudaGraphStrategy.WHOLE_GRAPH_CAPTURE``), with shape-specialised kernels
    compiled before the first capture (``DynamicShapesKernelSpecializationStrategy.EAGER``; the
    default LAZY one would capture the generic fallback kernels and replay them for good); names
    an older TensorRT-RTX lacks are skipped and the context runs without graphs.
    On TensorRT there is no runtime cache: a plain ``create_execution_context``.
    """
    trt = backend.trt
    strategy = None
    if allocation_strategy is not None:
        members = trt.ExecutionContextAllocationStrategy.__members__
        if allocation_strategy.upper() not in members:
            raise ConfigError(
                f"allocation strategy {allocation_strategy!r} unknown; use one of "
                f"{', '.join(m.lower() for m in members)}"
            )
        strategy = members[allocation_strategy.upper()]
    if not backend.is_rtx:
        context = (
            engine.create_execution_context(strategy) if strategy is not None else engine.create_execution_context()
        )
        return EngineContext(context)
    runtime_config = engine.create_runtime_config()
    if strategy is not None:
        runtime_config.set_execution_context_allocation_strategy(strategy)
    handle = EngineContext(None, runtime_config=runtime_config)
    if cuda_graphs:
        handle.builtin_graphs = _rtx_graphs(trt, runtime_config)
    if shared is not None and shared.cache is not None:
        handle.cache, handle.cache_path, handle.owns_cache = shared.cache, shared.cache_path, False
        if not runtime_config.set_runtime_cache(handle.cache):
            handle.cache = None
    elif runtime_cache is not None:
        handle.cache_path = Path(runtime_cache)
        handle.cache = runtime_config.create_runtime_cache()
        if handle.cache_path.is_file():
            handle.cache_loaded = bool(handle.cache.deserialize(handle.cache_path.read_bytes()))
            if not handle.cache_loaded:
                handle.notes.append(
                    f"runtime cache {handle.cache_path} was made for another GPU, driver or "
                    "TensorRT-RTX version; starting empty (it is rewritten on save)"
                )
        if not runtime_config.set_runtime_cache(handle.cache):
            handle.notes.append("TensorRT-RTX refused the runtime cache; running without one")
            handle.cache = None
    handle.context = engine.create_execution_context(runtime_config)
    for note in handle.notes:
        log.warning(note)
    return handle


def _rtx_graphs(trt: Any, runtime_config: Any) -> bool:
    """Ask TensorRT-RTX for whole-graph capture with eagerly specialised kernels; True when it took."""
    eager = getattr(getattr(trt, "DynamicShapesKernelSpecializationStrategy", None), "EAGER", None)
    whole = getattr(getattr(trt, "CudaGraphStrategy", None), "WHOLE_GRAPH_CAPTURE", None)
    if eager is None or whole is None or not hasattr(runtime_config, "cuda_graph_strategy"):
        log.info("this TensorRT-RTX has no built-in CUDA graph strategy; executes run without graphs")
        return False
    runtime_config.dynamic_shapes_kernel_specialization_strategy = eager
    runtime_config.cuda_graph_strategy = whole
    return True
