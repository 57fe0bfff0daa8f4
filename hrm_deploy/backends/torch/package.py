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
from pathlib import Path
from typing import Any

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
    """``torch._inductor.aoti_load_package`` with the options the device loop needs, unzipped
    into this process's extraction folder, and whether the loaded model may be captured in a
    CUDA graph.

    AOTInductor's default runner synchronises through CUDA events between calls; an event query
    inside a stream capture fails, so a captured loop needs ``run_single_threaded=True`` (torch
    documents the flag for CUDA graphs). ``device_index`` loads the weights onto the runner's GPU.
    A torch without the flag loads the default runner and the loop stays eager."""
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
    grant_amx(torch)
    with private_tmpdir():
        return load(str(path), **kwargs), capturable


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


def load_program(torch: Any, path: Path) -> Any:
    """An exported program (``torch.export.save``) as a ``torch.compile``d module: the build's
    fallback when AOTInductor could not compile, or could not be loaded here."""
    with open(path, "rb") as f:  # a file object: the name need not end in .pt2
        module = torch.export.load(f).module()
    return torch.compile(module, dynamic=True)


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
