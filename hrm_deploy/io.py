"""Small file helpers: atomic writes, hashing, staging folders and debris clean-up.

Nothing half-written is ever left behind under a final name: every write goes to a temp
file or staging folder in the target's folder (same file system) and is renamed into place
on success. Temp names carry the writer's pid (``.<name>.<pid>.<random>.tmp``,
``.<kind>-<pid>-<random>``) so a later run can tell debris of a killed process (pid gone)
from a concurrent writer's work in progress and remove only the former.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Debris written by versions before the pid was in the name is removed when older than this.
LEGACY_DEBRIS_AGE_S = 3600.0
_TMP_RE = re.compile(r"^\..+\.(?P<pid>\d+)\.[^.]+\.tmp$")
# Every kind of staging folder a stage makes (``staging_dir(folder, kind)``): its debris is known by name.
STAGING_KINDS = ("export-check", "stage", "build", "cpu-build", "torch-engine")
_STAGE_RE = re.compile(r"^\.(?:" + "|".join(re.escape(k) for k in STAGING_KINDS) + r")-(?P<pid>\d+)-[^/]+$")
_LEGACY_RE = re.compile(r"^(?:\.export-check-[^/]+|\..+\.tmp)$")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (this process included). A process of another
    user, or one the kernel will not tell about, counts as alive: its files are kept."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: exists, owned by someone else
        return True
    return True


def clean_debris(folder: str | os.PathLike) -> list[Path]:
    """Remove temp files and staging folders that a killed hrm-deploy process left in ``folder``.

    Only entries whose writer is gone are removed (pid in the name, or for names without a pid,
    older than :data:`LEGACY_DEBRIS_AGE_S`); a concurrent writer's work is never touched.
    Returns what was removed."""
    root = Path(folder)
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    now = time.time()
    for entry in root.iterdir():
        name = entry.name
        if not name.startswith("."):
            continue
        m = _TMP_RE.match(name) or _STAGE_RE.match(name)
        if m:
            stale = not pid_alive(int(m.group("pid")))
        elif _LEGACY_RE.match(name):
            try:
                stale = now - entry.lstat().st_mtime > LEGACY_DEBRIS_AGE_S
            except FileNotFoundError:
                continue
        else:
            continue
        if not stale:
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry)
        except FileNotFoundError:  # another process cleaned it first
            pass
    return removed


def workspace() -> Path:
    """The folder outputs may live in when a symlink is involved: the working directory."""
    return Path.cwd().resolve()


def check_output_path(path: str | os.PathLike) -> Path:
    """Refuse an output path that goes through a symlink leading outside the workspace.

    Inside the working directory, every component of the path (a planted ``bench`` folder link,
    a ``report.md`` link) must stay inside it when resolved. A path outside the working
    directory is the user's explicit choice (``--out /data/x``, whatever links its folders
    are); only its last component may not be a link that leads out of its own folder.
    Raises :class:`~hrm_deploy.errors.ArtifactError`."""
    from hrm_deploy.errors import ArtifactError

    p = Path(path)
    lexical = Path(os.path.abspath(p))
    cwd = Path(os.path.abspath(os.getcwd()))
    ws = workspace()

    def refuse(link: Path) -> ArtifactError:
        return ArtifactError(
            f"{p} goes through the symlink {link} -> {link.resolve()}, outside the workspace "
            f"{ws}; remove the link or write somewhere else"
        )

    try:
        if lexical.is_relative_to(cwd):
            current = cwd
            for part in lexical.relative_to(cwd).parts:
                current = current / part
                if current.is_symlink() and not current.resolve(strict=False).is_relative_to(ws):
                    raise refuse(current)
        elif lexical.is_symlink():
            real = lexical.resolve()
            if not real.is_relative_to(lexical.parent.resolve()) and not real.is_relative_to(ws):
                raise refuse(lexical)
    except RuntimeError:  # Path.resolve's "Symlink loop" (Python < 3.13; later ones raise ELOOP)
        raise _loop(p) from None
    except OSError as exc:
        from hrm_deploy.errors import machine_fault

        raise (machine_fault(exc, p) or exc) from None
    check_writable(p)
    return p


def _loop(path: Path) -> Exception:
    import errno

    from hrm_deploy.errors import machine_fault

    return machine_fault(OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))) or RuntimeError(path)


@contextlib.contextmanager
def naming_faults(path: str | os.PathLike, *, always: bool = False) -> Iterator[None]:
    """Re-raise a fault of the machine (disk full, read-only, ...) met while writing ``path`` as one
    :class:`~hrm_deploy.errors.MachineError` naming it: a failed ``write()`` carries no file name.
    ``always`` names ``path`` even when the error names another file (a private temp name)."""
    from hrm_deploy.errors import machine_fault

    try:
        yield
    except OSError as exc:
        if always:
            exc.filename = None
        fault = machine_fault(exc, path)
        if fault is None:
            raise
        raise fault from None
    except RuntimeError as exc:  # torch.save reports a failed write() as RuntimeError, without errno
        torch_fault = _torch_write_fault(exc, path)
        if torch_fault is None:
            raise
        raise torch_fault from None


def _torch_write_fault(exc: RuntimeError, path: str | os.PathLike) -> Exception | None:
    """One MachineError line for torch's zip writer failing a write (``unexpected pos``, ``file write
    failed``): a full device says so; None for any other RuntimeError (a bug keeps its traceback)."""
    import errno
    import shutil

    from hrm_deploy.errors import MachineError, machine_fault

    text = str(exc)
    if "unexpected pos" not in text and "file write failed" not in text and "PytorchStreamWriter" not in text:
        return None
    folder = Path(path).parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        free = None
    if free is not None and free < (64 << 20):  # what is left is less than any checkpoint worth writing
        return machine_fault(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), path)
    first = text.strip().splitlines()[0][:160] if text.strip() else type(exc).__name__
    return MachineError(f"{path}: writing it failed ({first}); check the device's free space and health")


def check_writable(path: str | os.PathLike) -> None:
    """Refuse, before any work, an output whose folder (its nearest existing ancestor) is on a
    read-only file system or not writable by this user: one MachineError line naming ``path``."""
    import errno

    from hrm_deploy.errors import machine_fault

    folder = Path(os.path.abspath(path)).parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return  # a file in the way: the write itself names it
    code = None
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        code = errno.EROFS
    elif not os.access(folder, os.W_OK | os.X_OK):
        code = errno.EACCES
    if code is not None:
        raise machine_fault(OSError(code, os.strerror(code), str(path))) or OSError(code, str(path))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path in the target's folder; rename it onto ``path`` only on success.

    The rename replaces a symlink at ``path`` itself (never writes through it), and
    :func:`check_output_path` refuses links that lead outside the workspace."""
    target = check_output_path(path)
    with naming_faults(target, always=True):
        target.parent.mkdir(parents=True, exist_ok=True)
        clean_debris(target.parent)  # temp files of killed writers (pid gone) in this folder
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
    tmp_path = Path(tmp)
    try:
        with naming_faults(target):
            yield tmp_path
            if tmp_path.exists():  # mkstemp makes 0600 files; give the result the usual umask mode
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(tmp_path, 0o666 & ~umask)
            os.replace(tmp_path, target)
    finally:
        with contextlib.suppress(OSError):  # gone, or its folder went read-only meanwhile
            tmp_path.unlink()


@contextlib.contextmanager
def staging_dir(folder: str | os.PathLike, kind: str = "stage") -> Iterator[Path]:
    """A private staging folder ``<folder>/.<kind>-<pid>-XXXX`` removed on exit (success,
    error, Ctrl-C or SIGTERM via the CLI's handler). Debris of killed runs is cleaned first."""
    if kind not in STAGING_KINDS:  # its debris would never be recognised and removed
        from hrm_deploy.errors import InternalError

        raise InternalError(f"staging kind {kind!r} is not one of io.STAGING_KINDS")
    root = Path(folder)
    with naming_faults(root, always=True):
        root.mkdir(parents=True, exist_ok=True)
        clean_debris(root)
        staging = Path(tempfile.mkdtemp(prefix=f".{kind}-{os.getpid()}-", dir=root))
    try:
        with naming_faults(root, always=True):
            yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Write ``data`` as JSON atomically (see :func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    return Path(path)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` atomically (see :func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line to a log (``metrics.jsonl``) with a single ``write`` of the whole line,
    refusing a symlink that leads outside the workspace."""
    target = check_output_path(path)
    with naming_faults(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            os.write(fd, (line.rstrip("\n") + "\n").encode())
        finally:
            os.close(fd)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def json_sha256(data: Any) -> str:
    """sha256 of ``data``'s canonical JSON (sorted keys, no spaces; other types as ``str``): the
    seal of a manifest, the checksum of a cache entry."""
    return sha256_bytes(json.dumps(data, sort_keys=True, default=str, separators=(",", ":")).encode())


def cache_dir(*parts: str) -> Path:
    """The user cache folder for ``parts`` (datasets regenerated from provenance, halting
    calibrations of files we did not write): ``$HRM_DEPLOY_CACHE``, else the platform's user
    cache dir (``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux, ``~/Library/Caches`` on macOS,
    ``%LOCALAPPDATA%`` on Windows) plus ``hrm-deploy``. Never the package or an artifact's folder."""
    import sys

    env = os.environ.get("HRM_DEPLOY_CACHE")
    if env:
        base = Path(env)
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches" / "hrm-deploy"
    elif sys.platform.startswith("win"):
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "hrm-deploy" / "Cache"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hrm-deploy"
    return base.joinpath(*parts)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """True when ``a`` and ``b`` are the same file on disk (through links, hard links included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def not_a_plain_file(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it exists but is neither a regular file nor a folder ("a FIFO", "a
    character device", "a link that leads nowhere (a loop or a missing target)", ...); None for a
    regular file, a folder, or nothing at all. Reading a FIFO or /dev/zero would block or never end."""
    import errno
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.ENOENT and os.path.islink(path)):
            return "a link that leads nowhere (a loop or a missing target)"
        return None
    kinds = {
        stat.S_ISFIFO: "a FIFO (named pipe)",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
    }
    return next((what for test, what in kinds.items() if test(mode)), None)
