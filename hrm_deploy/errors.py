"""One error hierarchy for the whole toolkit.

Every error a user can cause derives from :class:`HRMDeployError`; the CLI prints
its message as one line (no traceback) and exits non-zero. Messages name the
problem *and* the fix. Internal bugs are ordinary exceptions and keep their
traceback.
"""

from __future__ import annotations

import os


class HRMDeployError(Exception):
    """Base class of user-facing errors: the message is the whole story."""

    exit_code = 2


class ConfigError(HRMDeployError):
    """A configuration value is missing, inconsistent or out of range."""


class CheckpointError(HRMDeployError):
    """A checkpoint file cannot be read or does not match the model config."""


class DataError(HRMDeployError):
    """A dataset is missing files, has wrong shapes or does not fit the model."""


class ExportError(HRMDeployError):
    """The exported graph failed a structural check."""


class ParityError(ExportError):
    """An artifact's outputs differ from the PyTorch reference beyond tolerance."""

    exit_code = 3


class DependencyError(HRMDeployError):
    """An optional dependency is missing; the message names the extra to install."""


class ArtifactError(HRMDeployError):
    """An artifact (ONNX, engine, manifest) is missing, corrupt or of the wrong kind."""


def install_hint(extra: str) -> str:
    """The pip command that adds ``extra`` to *this* installation: ``pip install -e 'DIR[extra]'``
    when hrm-deploy runs from a source checkout (its ``pyproject.toml`` beside the package, where
    ``'hrm-deploy[extra]'`` would fetch the package from the index instead), else
    ``pip install 'hrm-deploy[extra]'``."""
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    project = root / "pyproject.toml"
    try:
        ours = project.is_file() and 'name = "hrm-deploy"' in project.read_text()
    except OSError:
        ours = False
    if ours:
        return f"pip install -e {shlex.quote(f'{root}[{extra}]')}"
    return f"pip install 'hrm-deploy[{extra}]'"


def require(module: str, extra: str, purpose: str):
    """Import ``module`` or raise a :class:`DependencyError` naming the pip extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DependencyError(
            f"{purpose} needs the Python package '{module.split('.')[0]}' ({exc}); "
            f"install it with: {install_hint(extra)}"
        ) from None


class MachineError(HRMDeployError):
    """The machine refused a file operation (disk full, read-only, permissions, link loops, too many
    open files, a name too long): the message names the path, the cause and the fix."""


# errno name -> (cause, fix); the errno module's names, so the table reads without numbers
_FAULTS = {
    "ENOSPC": ("no space left on its device", "free some space or write elsewhere"),
    "EDQUOT": ("the disk quota is exhausted", "free some space or write elsewhere"),
    "EROFS": ("its file system is read-only", "write to a writable folder (-o/--out) instead"),
    "EACCES": ("permission denied", "write to a folder you own (-o/--out) or fix its permissions"),
    "EPERM": ("operation not permitted", "write to a folder you own (-o/--out) or fix its permissions"),
    "ENOTDIR": ("a part of the path is a file, not a folder", "fix the path"),
    "ELOOP": ("too many levels of symbolic links (a loop or a long chain)", "fix the links or give the real path"),
    "EMFILE": ("this process has too many open files", "raise the limit (ulimit -n) and run again"),
    "ENFILE": ("the system has too many open files", "close other programs and run again"),
    "ENAMETOOLONG": ("the name is too long for the file system", "choose a shorter path"),
    "EISDIR": ("it is a folder", "give a file path"),
    "EEXIST": ("a file of that name is in the way of a folder", "remove it or choose another path"),
}


def machine_fault(exc: BaseException, path: object = None) -> MachineError | None:
    """One :class:`MachineError` line for an ``OSError`` the machine raised (see ``_FAULTS``), naming
    ``exc.filename`` or else ``path``; None for any other error (a bug keeps its traceback)."""
    import errno

    if not isinstance(exc, OSError) or exc.errno is None:
        return None
    name = errno.errorcode.get(exc.errno, "")
    if name not in _FAULTS:
        return None
    cause, fix = _FAULTS[name]
    where = exc.filename if exc.filename is not None else path
    cache = os.environ.get("HRM_DEPLOY_CACHE")
    if cache and where is not None:  # the user's cache setting is what to fix, not an output option
        inside, base = os.path.abspath(str(where)), os.path.abspath(cache)
        if inside == base or inside.startswith(base.rstrip(os.sep) + os.sep):
            fix = f"point HRM_DEPLOY_CACHE ({cache}) at a writable folder, or unset it"
    return MachineError(f"{where if where is not None else 'a file'}: {cause}; {fix}")


class EngineError(HRMDeployError):
    """A TensorRT engine could not be built or loaded (parser errors, build failure, mismatch)."""


class InternalError(Exception):
    """A bug in hrm-deploy, not a user error ("please report this").

    Deliberately *outside* the :class:`HRMDeployError` hierarchy: the CLI shows its
    traceback and says it is a bug instead of printing it as a one-line user error."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{message} (this is a bug in hrm-deploy; please report it with the traceback above)")


class RemoteError(HRMDeployError):
    """Another machine (an ssh host for ``bench --host``, a server for ``solve --url``) could not
    be reached, timed out or refused the request; its message follows."""


class VerifyError(HRMDeployError):
    """An artifact failed ``verify``: its answers differ from the PyTorch reference beyond the
    budget (argmax agreement or exact-accuracy drop). Exit code 3, as a parity failure."""

    exit_code = 3
