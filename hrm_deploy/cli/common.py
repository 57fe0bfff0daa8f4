"""Helpers shared by the commands: user errors as one line, JSON printing."""

from __future__ import annotations

import functools
import json
import signal
import sys
import threading
from typing import Any, Callable, TypeVar

import typer

from hrm_deploy.errors import HRMDeployError, InternalError

# The bundled presets live with the trainer; re-exported here for the commands.
from hrm_deploy.train.presets import DEFAULT_PRESET, bundled_checkpoint  # noqa: F401

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn an :class:`HRMDeployError` into ``error: <message>`` and its exit code, no traceback.

    SIGTERM/SIGHUP are turned into :class:`KeyboardInterrupt` so staging folders and temp
    files are removed (``finally`` blocks run) and training checkpoints, exactly as on Ctrl-C.
    An :class:`InternalError` keeps its traceback and is reported as a bug."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
                if sig is not None:
                    signal.signal(sig, _interrupt)
        try:
            return fn(*args, **kwargs)
        except HRMDeployError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except InternalError:
            import traceback

            traceback.print_exc()
            typer.echo(
                "internal error: this is a bug in hrm-deploy, not a problem with your input; "
                "please report it with the traceback above",
                err=True,
            )
            raise typer.Exit(70) from None
        except KeyboardInterrupt:
            typer.echo("interrupted; nothing half-written was left behind", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
