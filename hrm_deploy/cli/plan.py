"""``hrm-deploy plan``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.choices import Precision, Target
from hrm_deploy.cli.common import print_json, user_errors


@app.command()
@user_errors
def plan(
    artifact: Annotated[
        Path | None,
        typer.Argument(help="ONNX graph (export or precision graph) or TensorRT engine (default: the newest export)."),
    ] = None,
    target: Annotated[Target, typer.Option(help="The target whose memory to plan against.")] = "jetson-orin-8gb",
    precision: Annotated[
        Precision | None,
        typer.Option(help="What the graph will be built as (default: the graph's own; an FP32 export: fp16)."),
    ] = None,
    max_batch: Annotated[
        int | None, typer.Option(help="The profile's largest batch (default: the engine's, else the target's).")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Does an engine of this graph fit the target's memory, and at what batch? Weights by precision,
    the puzzle table, activations, carry and I/O per batch bucket, the runtime's own, against the
    target's budget; what to change when it does not fit (exit 2)."""
    from hrm_deploy.engines.plan import memory_plan
    from hrm_deploy.engines.result import newest_export
    from hrm_deploy.errors import ConfigError

    if max_batch is not None and max_batch < 1:
        raise ConfigError(f"--max-batch must be >= 1, got {max_batch}")
    result = memory_plan(
        artifact or newest_export(),
        str(target),
        precision=str(precision) if precision else None,
        max_batch=max_batch,
    )
    if json_out:
        print_json(result.as_dict())
    else:
        typer.echo(result.table())
    if not result.fits:
        raise ConfigError(result.refusal())
