"""``hrm-deploy serve`` and ``hrm-deploy triton-repo``."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.common import user_errors


@app.command()
@user_errors
def serve(
    artifact: Path = typer.Argument(..., help="ONNX graph (ONNX Runtime), engine (TensorRT) or checkpoint (PyTorch)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; non-loopback needs --allow-remote."),
    http_port: int = typer.Option(8000, help="HTTP port (KServe v2 protocol)."),
    grpc_port: int = typer.Option(8001, help="gRPC port."),
    metrics_port: int = typer.Option(8002, help="Prometheus metrics port."),
    max_batch: Optional[int] = typer.Option(None, help="Largest batch Triton forms (default: the artifact's)."),
    halt: str = typer.Option("off", help="Early halting: off | q | threshold:X."),
    allow_remote: bool = typer.Option(False, help="Allow binding a non-loopback address (no authentication!)."),
    model_name: str = typer.Option("hrm", help="Model name clients address."),
    queue_delay_us: int = typer.Option(2000, help="Dynamic batcher: longest wait for more requests (microseconds)."),
    provider: Optional[str] = typer.Option(None, help="ONNX Runtime provider for ONNX artifacts: cpu, cuda, tensorrt."),
) -> None:
    """Serve an artifact on PyTriton's Triton Inference Server until Ctrl-C / SIGTERM."""
    from hrm_deploy.serve.server import ServeConfig, main_ready_line
    from hrm_deploy.serve.server import serve as run_server

    code = run_server(ServeConfig(artifact=artifact, host=host, http_port=http_port, grpc_port=grpc_port,
                                  metrics_port=metrics_port, max_batch=max_batch, halt=halt,
                                  allow_remote=allow_remote, model_name=model_name, queue_delay_us=queue_delay_us,
                                  provider=provider), ready=main_ready_line)
    if code:
        typer.echo("error: tritonserver stopped unexpectedly; see the log above", err=True)
        raise typer.Exit(code)
    typer.echo("server stopped", err=True)
