"""Helpers shared by the commands: user errors as one line, JSON printing."""

from __future__ import annotations

import functools
import json
import sys
from typing import Any, Callable, TypeVar

import typer

from hrm_deploy.errors import HRMDeployError

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn an :class:`HRMDeployError` into ``error: <message>`` and its exit code, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except HRMDeployError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            typer.echo("interrupted; nothing half-written was left behind", err=True)
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def bundled_checkpoint() -> str:
    """Path of the small trained checkpoint shipped with the package (the embedded default)."""
    from importlib import resources

    return str(resources.files("hrm_deploy") / "train" / "presets" / "sudoku-tiny.pt")
