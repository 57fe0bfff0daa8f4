"""``hrm-deploy verify``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.choices import Provider
from hrm_deploy.cli.common import user_errors


@app.command()
@user_errors
def verify(
    artifact: Annotated[Path, typer.Argument(help="ONNX graph or TensorRT engine to check.")],
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="Dataset folder (its test split), .npz with inputs and labels, or a benchmark's CSVs / "
            "hf:ORG/NAME (e.g. hf:sapientinc/sudoku-extreme; its test split is built once into the user cache) "
            "(default: the checkpoint's own dataset).",
        ),
    ] = None,
    against: Annotated[
        Path | None,
        typer.Option(help="Reference checkpoint, run folder or hf:ORG/NAME (default: the one the manifests name)."),
    ] = None,
    samples: Annotated[int, typer.Option(help="Examples K (deterministic subset; 0: all).")] = 256,
    provider: Annotated[Provider, typer.Option(help="ONNX Runtime provider for .onnx.")] = Provider.CPU,
    min_agreement: Annotated[float | None, typer.Option(help="Override: minimum argmax agreement (fraction).")] = None,
    max_drop: Annotated[float | None, typer.Option(help="Override: maximum exact-accuracy drop (points).")] = None,
    halt: Annotated[
        list[str] | None,
        typer.Option(
            "--halt",
            help="Also report early halting under this rule "
            "(repeatable): q, threshold:X, budget:P (calibrated on the train split, "
            "stored in the manifest).",
        ),
    ] = None,
    min_steps: Annotated[int, typer.Option(help="Halting: never stop before this ACT step.")] = 1,
    max_steps: Annotated[int | None, typer.Option(help="Halting: always stop at this ACT step.")] = None,
) -> None:
    """Compare an artifact with its PyTorch reference on real examples; non-zero exit on failure."""
    from hrm_deploy.data.benchmarks import prepare_dataset
    from hrm_deploy.sources import resolve_optional_checkpoint
    from hrm_deploy.verify import markdown, verify as run_verify

    against = resolve_optional_checkpoint(against)  # before any work
    data = prepare_dataset(data)
    overrides = {
        k: v for k, v in (("min_argmax_agreement", min_agreement), ("max_exact_drop_points", max_drop)) if v is not None
    }
    from hrm_deploy.registry import runner_options

    options: dict[str, Any] = runner_options(artifact, provider=provider.value)
    report = run_verify(
        artifact,
        data,
        against=against,
        samples=samples or None,
        overrides=overrides,
        halt=halt,
        min_steps=min_steps,
        max_steps=max_steps,
        **options,
    )
    typer.echo(markdown(report))
    if not report["passed"]:
        from hrm_deploy.errors import VerifyError

        raise VerifyError(f"{artifact.name} FAILED verify: {'; '.join(report['failures'])}")
