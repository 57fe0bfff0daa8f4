"""Helpers shared by the commands: the Typer app class, user errors as one line, JSON printing,
the ``-q/--quiet`` option."""

from __future__ import annotations

import functools
import json
import signal
import sys
import threading
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from hrm_deploy.errors import HRMDeployError, InternalError, machine_fault

# The bundled presets live with the trainer; re-exported here for the commands.
from hrm_deploy.train.presets import DEFAULT_PRESET, bundled_checkpoint  # noqa: F401

# The option every command with a progress display takes.
Quiet = Annotated[bool, typer.Option("-q", "--quiet", help="No progress display.")]
# Ray (hrm_deploy.scale): spread the work over Ray workers; answers identical to one process
Ray = Annotated[
    bool,
    typer.Option("--ray", help="Run on Ray workers (pip install the scale extra); outputs identical to one process."),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        "--address", help="With --ray: auto (this machine's Ray cluster) or ray://HOST:PORT (default: a local Ray)."
    ),
]
RayWorkers = Annotated[
    int | None,
    typer.Option(
        "--workers",
        help="With --ray: workers, one runner each (default: one per CPU, or per GPU for GPU artifacts).",
    ),
]


def ray_config(ray: bool, address: str | None, workers: int | None):  # -> RayConfig | None
    """The --ray options as a config (None without --ray; --address or --workers alone is one line)."""
    from hrm_deploy.errors import ConfigError

    if not ray:
        given = [flag for flag, value in (("--address", address), ("--workers", workers)) if value is not None]
        if given:
            raise ConfigError(f"{' and '.join(given)} only apply with --ray; add --ray or drop them")
        return None
    from hrm_deploy.scale.cluster import RayConfig, ray_module

    ray_module()  # before any work: Ray missing is one line naming the install
    return RayConfig(address=address, workers=workers)


F = TypeVar("F", bound=Callable[..., Any])


def _flags_without_type(params: list[Any]) -> list[Any]:
    """Typer's help prints a type for every option, flags included (``--fp16 <bool>``), which
    reads as if the flag took a value; a flag gets an empty type instead."""
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""
    return params


class Command(TyperCommand):
    """A command whose ``--help`` shows flags as flags."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_type(super().get_params(ctx))


class Group(TyperGroup):
    """A command group whose ``--help`` shows flags as flags."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_without_type(super().get_params(ctx))


class App(typer.Typer):
    """``typer.Typer`` whose groups and commands are :class:`Group` and :class:`Command`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=Group, **kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", Command)
        return super().command(*args, **kwargs)


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
        except OSError as exc:  # the machine's faults (disk full, read-only, ...) are one line too
            fault = machine_fault(exc)
            if fault is None:
                raise
            typer.echo(f"error: {fault}", err=True)
            raise typer.Exit(fault.exit_code) from None
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
