"""Helpers shared by the commands: user errors as one line, JSON printing."""

from __future__ import annotations

import functools
import json
import sys
from typing import Any, Callable, TypeVar

import typer

from hrm_deploy.errors import ConfigError, HRMDeployError

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


DEFAULT_PRESET = "sudoku-small"


def bundled_checkpoint(preset: str = DEFAULT_PRESET) -> str:
    """Path of a trained checkpoint shipped with the package: ``sudoku-small`` (the embedded
    default: 8 ACT steps, the model every command uses when none is given) or ``sudoku-tiny``
    (one ACT step, the fast CPU test fixture)."""
    from importlib import resources

    path = resources.files("hrm_deploy") / "train" / "presets" / f"{preset}.pt"
    if not path.is_file():
        raise ConfigError(f"no bundled checkpoint for preset {preset!r}; bundled: sudoku-small, sudoku-tiny")
    return str(path)
