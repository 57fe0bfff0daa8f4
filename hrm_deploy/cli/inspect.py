"""``hrm-deploy inspect``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.common import print_json, user_errors


@app.command()
@user_errors
def inspect(
    artifact: Annotated[
        Path,
        typer.Argument(help="Checkpoint (file, run folder or hf:ORG/NAME), .onnx, engine, or *.manifest.json."),
    ],
) -> None:
    """Print an artifact's config, sizes, I/O and parameter count (and the Hub repository it came from)."""
    from hrm_deploy.inspection import inspect_artifact
    from hrm_deploy.sources import is_hub, resolve_checkpoint

    if is_hub(artifact):
        artifact = resolve_checkpoint(artifact)
    print_json(inspect_artifact(artifact))
