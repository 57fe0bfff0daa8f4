"""``hrm-deploy verify``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.common import user_errors


@app.command()
@user_errors
def verify(
    artifact: Path = typer.Argument(..., help="ONNX graph or TensorRT engine to check."),
    data: Optional[Path] = typer.Option(
        None,
        "--data",
        help="Dataset folder (its test split) or .npz with inputs and labels (default: the checkpoint's own dataset).",
    ),
    against: Optional[Path] = typer.Option(None, help="Reference checkpoint (default: the one the manifests name)."),
    samples: int = typer.Option(256, help="Examples K (deterministic subset; 0: all)."),
    provider: str = typer.Option("cpu", help="ONNX Runtime provider for .onnx: cpu, cuda or tensorrt."),
    min_agreement: Optional[float] = typer.Option(None, help="Override: minimum argmax agreement (fraction)."),
    max_drop: Optional[float] = typer.Option(None, help="Override: maximum exact-accuracy drop (points)."),
    halt: Optional[List[str]] = typer.Option(
        None,
        "--halt",
        help="Also report early halting under this rule "
        "(repeatable): q, threshold:X, budget:P (calibrated on the train split, "
        "stored in the manifest).",
    ),
    min_steps: int = typer.Option(1, help="Halting: never stop before this ACT step."),
    max_steps: Optional[int] = typer.Option(None, help="Halting: always stop at this ACT step."),
) -> None:
    """Compare an artifact with its PyTorch reference on real examples; non-zero exit on failure."""
    from hrm_deploy.verify import markdown, verify as run_verify

    overrides = {
        k: v for k, v in (("min_argmax_agreement", min_agreement), ("max_exact_drop_points", max_drop)) if v is not None
    }
    options: dict[str, Any] = {"provider": provider} if artifact.suffix == ".onnx" else {}
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
