"""Loading AOTInductor packages (``.pt2``) without leaving litter, with a recorded matmul precision.

Where a load unzips to: torch's C++ package loader unzips the package's model folder (the
compiled library with its weights, kernel binaries, metadata) into a fresh temporary folder
(``$TMPDIR/aotinductor_XXXXXX`` in the torch releases that read ``TMPDIR``, a hard-coded
``/tmp/XXXXXX`` in older ones) and removes it when the loaded model is destroyed. A process that
dies while a model is loaded (a crash, a kill, a timeout) leaves that folder behind: a full copy
of the engine per load. :func:`private_tmpdir` points ``TMPDIR`` at a folder of this process
(``<temp>/hrm-deploy-aoti-<uid>/<host>-<pid>``) while the loader runs, and first removes the
folders of processes on this host that are gone; a closed runner releases its model, whose
destructor removes its own folder. A torch that ignores ``TMPDIR`` still unzips to ``/tmp``.

TF32: :func:`tf32_matmuls` sets whether float32 CUDA matmuls may use TF32 (torch's default: no).
Inductor reads the flag when it compiles its own matmul kernels and cuBLAS reads it on every
call, so the builder sets it around the compile and the runner for its process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Any

from hrm_deploy.errors import InternalError
from hrm_deploy.io import pid_alive

log = logging.getLogger(__name__)

ROOT_PREFIX = "hrm-deploy-aoti-"
_env_lock = threading.Lock()


def extraction_root() -> Path:
    """The folder under the temp folder that holds one extraction folder per loading process."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"{ROOT_PREFIX}{uid}"


def _host() -> str:
    return "".join(c if c.isalnum() or c in "._" else "_" for c in socket.gethostname())[:64] or "host"


def sweep_stale(root: Path | None = None) -> list[Path]:
    """Remove the extraction folders of processes on this host that no longer run; returns them.
    Folders of other hosts (a shared temp folder) and of live processes are kept."""
    root = root or extraction_root()
    removed: list[Path] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    host = _host()
    for entry in entries:
        name_host, _, pid = entry.name.rpartition("-")
        if name_host != host or not pid.isdigit() or not entry.is_dir(follow_symlinks=False):
            continue
        if not pid_alive(int(pid)):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    if removed:
        log.info("removed %d unzip folder(s) that ended processes left in %s", len(removed), root)
    return removed


def _own_folder(root: Path) -> Path | None:
    """``root/<host>-<pid>``, created private; None where ``root`` is not ours (another user's
    folder or a link planted in a shared temp folder): the load then unzips where torch says."""
    try:
        root.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(root)
        if hasattr(os, "getuid") and (info.st_uid != os.getuid() or not os.path.isdir(root) or root.is_symlink()):
            return None
        folder = root / f"{_host()}-{os.getpid()}"
        folder.mkdir(mode=0o700, exist_ok=True)
        return folder
    except OSError as exc:
        log.debug("no private unzip folder under %s (%s)", root, exc)
        return None


@contextlib.contextmanager
def private_tmpdir(root: Path | None = None) -> Iterator[Path | None]:
    """While the body runs, ``TMPDIR`` is this process's extraction folder (yielded; None when
    it could not be made), after removing the folders of ended processes. Python's own
    ``tempfile`` keeps the folder it chose at its first use; only the C++ loader sees this."""
    root = root or extraction_root()
    sweep_stale(root)
    folder = _own_folder(root)
    if folder is None:
        yield None
        return
    with _env_lock:
        old = os.environ.get("TMPDIR")
        os.environ["TMPDIR"] = str(folder)
        try:
            yield folder
        finally:
            if old is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = old
            with contextlib.suppress(OSError):  # nothing unzipped there (or a failed load): no empty folder left
                folder.rmdir()


def release_folder(root: Path | None = None) -> None:
    """Remove this process's extraction folder once it is empty (every model it held destroyed)."""
    folder = (root or extraction_root()) / f"{_host()}-{os.getpid()}"
    with contextlib.suppress(OSError):
        folder.rmdir()


def load_aoti_package(torch: Any, path: Path, *, single_threaded: bool, device_index: int) -> tuple[Any, bool]:
    """The package at ``path`` loaded with the options the device loop needs, unzipped into this
    process's extraction folder, and whether the loaded model may be captured in a CUDA graph.

    AOTInductor's default runner synchronises through CUDA events between calls; an event query
    inside a stream capture fails, so a captured loop needs ``run_single_threaded=True`` (torch
    documents the flag for CUDA graphs). ``device_index`` loads the weights onto the runner's GPU.
    A torch without the flag loads the default runner and the loop stays eager.

    The load goes through torch's C++ loader (:class:`LoadedPackage`): torch's Python wrapper
    (``aoti_load_package``) first works out this host's instruction set to compare it with the
    package's, by compiling and loading a test program per candidate (up to five on an AMX host,
    each a compiler run and a child interpreter: about 30 s per fresh process on an H100 host),
    only to log a warning on a mismatch. :func:`check_cpu_isa` does that comparison from the
    CPU's flags instead; the load probe still decides whether the package loads."""
    grant_amx(torch)
    with private_tmpdir():
        loaded = _cpp_load(torch, path, single_threaded, max(device_index, -1))
        if loaded is not None:
            return loaded, True
        return _python_load(torch, path, single_threaded=single_threaded, device_index=device_index)


def _cpp_load(torch: Any, path: Path, single_threaded: bool, device_index: int) -> LoadedPackage | None:
    """The package through ``torch._C._aoti.AOTIModelPackageLoader``, or None for a torch whose
    loader is missing or takes other arguments (then torch's Python wrapper loads it)."""
    loader_type = getattr(getattr(getattr(torch, "_C", None), "_aoti", None), "AOTIModelPackageLoader", None)
    if loader_type is None:
        return None
    try:
        metadata = loader_type.load_metadata_from_package(str(path), "model")
    except (AttributeError, TypeError):
        metadata = {}
    check_cpu_isa(torch, path, dict(metadata))
    try:
        # (path, model name in the package, run_single_threaded, number of runners, device index)
        loader = loader_type(str(path), "model", single_threaded, 1, device_index)
    except TypeError as exc:  # another signature: torch's own wrapper knows it
        log.debug("torch's C++ package loader takes other arguments (%s); loading through aoti_load_package", exc)
        return None
    return LoadedPackage(loader)


def _python_load(torch: Any, path: Path, *, single_threaded: bool, device_index: int) -> tuple[Any, bool]:
    """``torch._inductor.aoti_load_package`` with the options its signature takes."""
    import inspect

    load = torch._inductor.aoti_load_package
    params = inspect.signature(load).parameters
    kwargs: dict[str, Any] = {}
    capturable = True
    if single_threaded:
        if "run_single_threaded" in params:
            kwargs["run_single_threaded"] = True
        else:
            capturable = False
            log.warning(
                "torch %s cannot load AOTInductor for CUDA graphs; the step loop runs eagerly", torch.__version__
            )
    if device_index >= 0 and "device_index" in params:
        kwargs["device_index"] = device_index
    return load(str(path), **kwargs), capturable


class LoadedPackage:
    """A package loaded by torch's C++ loader, called with the engine's inputs as positional
    tensors; returns its outputs. The call spec (how inputs and outputs nest) is parsed once
    here: torch's wrapper parses it on every call, a cost per ACT step of an eager loop."""

    def __init__(self, loader: Any):
        from torch.utils import _pytree as pytree

        self.loader = loader
        in_spec, out_spec = loader.get_call_spec()
        self.num_inputs = pytree.treespec_loads(in_spec).num_leaves  # ((inputs...), {}): the inputs
        self._out_spec = pytree.treespec_loads(out_spec)
        self._unflatten = pytree.tree_unflatten

    def __call__(self, *inputs: Any) -> Any:
        if len(inputs) != self.num_inputs:  # the manifest's io and the package disagree: a build bug
            raise InternalError(f"the package takes {self.num_inputs} inputs, not {len(inputs)}")
        return self._unflatten(self.loader.boxed_run(list(inputs)), self._out_spec)

    def get_metadata(self) -> dict[str, str]:
        """The package's metadata (device, instruction set it was compiled for, ...)."""
        return dict(self.loader.get_metadata())


def check_cpu_isa(torch: Any, path: Path, metadata: dict[str, str]) -> bool:
    """Whether this CPU has every instruction-set extension the package's CPU code was compiled
    for (its ``AOTI_CPU_ISA``, e.g. ``AVX512 AVX512_VNNI AMX_TILE``); a warning where not (the load
    probe then decides). Read from torch's CPU checks, which read the CPU's flags: no compiling."""
    wanted = metadata.get("AOTI_CPU_ISA", "").lower().split()
    cpu = getattr(torch, "cpu", None)
    checks = {
        "avx2": "_is_avx2_supported",
        "avx512": "_is_avx512_supported",
        "avx512_vnni": "_is_vnni_supported",
        "amx_tile": "_is_amx_tile_supported",
    }
    missing = []
    for flag in wanted:
        check = getattr(cpu, checks.get(flag, ""), None)
        if check is not None and not check():
            missing.append(flag)
    if missing:
        log.warning(
            "%s was compiled for %s; this CPU lacks %s: the load probe decides whether it runs here",
            path.name,
            metadata["AOTI_CPU_ISA"],
            ", ".join(missing),
        )
    return not missing


class LoadFix(str, Enum):
    """What a loading process sets up before it loads a package (docs/gpu.md, the H100 crash)."""

    AMX_PERMISSION = "amx-permission"  # ask Linux for AMX tile data (always; a no-op without AMX)
    ONNXRUNTIME_FIRST = "onnxruntime-first"  # import onnxruntime before CUDA and the load, where installed


FIX_ENV = "HRM_DEPLOY_AOTI_IMPORT_ORT"  # "1": also import onnxruntime first (the device check proves it)


def load_fixes() -> tuple[LoadFix, ...]:
    """The fixes this process applies before a load: the AMX permission, and onnxruntime's import
    first where :data:`FIX_ENV` is ``1`` (part of the load probe's cache key)."""
    if os.environ.get(FIX_ENV, "") == "1":
        return (LoadFix.AMX_PERMISSION, LoadFix.ONNXRUNTIME_FIRST)
    return (LoadFix.AMX_PERMISSION,)


def prepare_load(torch: Any, fixes: tuple[LoadFix, ...] | None = None) -> dict[str, Any]:
    """Apply ``fixes`` (default :func:`load_fixes`) before CUDA is initialised and a package loaded;
    returns what was asked and what this process has now (the ``load_check`` record): the
    permission mask before and after (``ARCH_GET_XCOMP_PERM``; bit 18 is AMX tile data)."""
    from hrm_deploy.backends.torch.host import amx_permitted, xcomp_permission_mask

    fixes = load_fixes() if fixes is None else fixes
    before = xcomp_permission_mask()
    applied: list[str] = []
    if LoadFix.ONNXRUNTIME_FIRST in fixes:
        try:
            import onnxruntime  # noqa: F401 - its import is the fix (it asks for the AMX permission)

            applied.append(LoadFix.ONNXRUNTIME_FIRST.value)
            log.debug("imported onnxruntime before loading the package (%s=1)", FIX_ENV)
        except ImportError:
            log.debug("%s=1 but onnxruntime is not installed: not imported", FIX_ENV)
    granted = grant_amx(torch) if LoadFix.AMX_PERMISSION in fixes else None
    if granted is not None:
        applied.append(LoadFix.AMX_PERMISSION.value)
    after = xcomp_permission_mask()
    return {
        "fixes_requested": [f.value for f in fixes],
        "fixes_applied": applied,
        "amx_requested": LoadFix.AMX_PERMISSION in fixes,
        "amx_granted": granted,
        "amx_permitted": amx_permitted(after),
        "xcomp_mask_before": None if before is None else hex(before),
        "xcomp_mask": None if after is None else hex(after),
    }


def grant_amx(torch: Any) -> bool:
    """Ask Linux for the AMX tile-data permission (``arch_prctl(ARCH_REQ_XCOMP_PERM)``, through
    ``torch.cpu._init_amx``) before a package is loaded; True where it is granted, False where the
    CPU has no AMX or torch cannot ask.

    Inductor asks for it while it compiles (its AMX check), so the process that builds a package
    has it; a fresh process does not. On an H100 host (Sapphire Rapids, packages compiled for
    ``AVX512 AVX512_VNNI AMX_TILE``) creating the model container of a CUDA package died (SIGSEGV)
    in every fresh process, and loaded in every one that had imported onnxruntime first, whose
    import is the only one that asks for this permission (docs/gpu.md). The load probe checks the
    result: where a load still dies, the engine's fallback runs as before."""
    init = getattr(getattr(torch, "cpu", None), "_init_amx", None)
    if init is None:
        return False
    try:
        return bool(init())
    except (RuntimeError, OSError) as exc:  # a kernel that refuses: the load goes on without it
        log.debug("AMX tile-data permission not granted (%s)", exc)
        return False


@contextlib.contextmanager
def tf32_matmuls(torch: Any, enabled: bool) -> Iterator[None]:
    """Float32 CUDA matmuls may use TF32 while the body runs; restored after."""
    old = torch.backends.cuda.matmul.allow_tf32
    set_tf32(torch, enabled)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


def set_tf32(torch: Any, enabled: bool) -> None:
    """Set, for this process, whether float32 CUDA matmuls may use TF32 (False: exact float32).
    The models have no convolutions, so cuDNN's own TF32 flag is left as it is."""
    torch.backends.cuda.matmul.allow_tf32 = bool(enabled)
