"""The ``hrm-deploy`` command line: one Typer command per file, each a thin wrapper
that parses options and calls one public library function."""

from __future__ import annotations

from typing import Annotated

import typer

from hrm_deploy import __version__
from hrm_deploy.cli.common import App

app = App(
    name="hrm-deploy",
    help="Take trained HRM and TRM checkpoints to checked ONNX graphs, engines (TensorRT, TensorRT-RTX, AOTInductor, ONNX Runtime CPU), answers and servers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"hrm-deploy {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit.")
    ] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show the library's debug messages and which module said what.")
    ] = False,
) -> None:
    """checkpoint -> export (ONNX) -> build-engine (TensorRT, TensorRT-RTX, AOTInductor, cpu) -> verify / bench."""
    from hrm_deploy.cli.logs import setup_logging

    setup_logging(verbose)


def _register() -> None:
    # Command modules import only typer and light helpers at module level.
    from hrm_deploy.cli import (  # noqa: F401
        adapt,
        arc,
        bench,
        data,
        doctor,
        engine,
        export,
        inspect,
        plan,
        profile,
        serve,  # noqa: F401
        solve,
        train,
        verify,
    )


_register()


def main() -> None:
    app()
