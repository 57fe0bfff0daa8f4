"""``hrm-deploy doctor``."""

from __future__ import annotations

from hrm_deploy.cli import app
from hrm_deploy.cli.common import user_errors


@app.command()
@user_errors
def doctor() -> None:
    """Print what this machine can do (torch/CUDA, working ONNX Runtime providers, TensorRT, Jetson)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from hrm_deploy.doctor import diagnose

    table = Table("capability", "status", "detail", "to enable")
    for check in diagnose():
        table.add_row(
            check.name, "[green]ok[/]" if check.ok else "[yellow]missing[/]", escape(check.detail), escape(check.fix)
        )
    Console().print(table)
