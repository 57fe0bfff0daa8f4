"""One error hierarchy for the whole toolkit.

Every error a user can cause derives from :class:`HRMDeployError`; the CLI prints
its message as one line (no traceback) and exits non-zero. Messages name the
problem *and* the fix. Internal bugs are ordinary exceptions and keep their
traceback.
"""

from __future__ import annotations


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


def require(module: str, extra: str, purpose: str):
    """Import ``module`` or raise a :class:`DependencyError` naming the pip extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise DependencyError(
            f"{purpose} needs the Python package '{module.split('.')[0]}' ({exc}); "
            f"install it with: pip install 'hrm-deploy[{extra}]'"
        ) from None


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
