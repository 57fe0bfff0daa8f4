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
    from hrm_deploy.serve.server import ServeConfig, main_ready_line, serve as run_server

    code = run_server(
        ServeConfig(
            artifact=artifact,
            host=host,
            http_port=http_port,
            grpc_port=grpc_port,
            metrics_port=metrics_port,
            max_batch=max_batch,
            halt=halt,
            allow_remote=allow_remote,
            model_name=model_name,
            queue_delay_us=queue_delay_us,
            provider=provider,
        ),
        ready=main_ready_line,
    )
    if code:
        typer.echo("error: tritonserver stopped unexpectedly; see the log above", err=True)
        raise typer.Exit(code)
    typer.echo("server stopped", err=True)


@app.command("triton-repo")
@user_errors
def triton_repo(
    artifacts: List[Path] = typer.Argument(..., help="ONNX graphs and/or engines (with their manifests)."),
    output: Path = typer.Option(..., "-o", "--output", help="Repository folder to write."),
    max_batch: Optional[int] = typer.Option(
        None, help="max_batch_size (default: engine profile max / export max batch)."
    ),
    queue_delay_us: int = typer.Option(2000, help="dynamic_batching max_queue_delay_microseconds."),
    instances: int = typer.Option(1, help="Instances per model (per GPU for GPU models)."),
    device: Optional[str] = typer.Option(None, help="ONNX graphs: cpu (default) or gpu; engines are always gpu."),
    onnx_backend: str = typer.Option(
        "onnxruntime", help="onnxruntime backend, or python (ONNX Runtime inside the Python backend)."
    ),
    trt_accelerator: Optional[str] = typer.Option(
        None, help="ONNX on GPU: ONNX Runtime's TensorRT accelerator, fp16 or fp32."
    ),
    halt: str = typer.Option("off", help="Step models' ACT driver: off | q | threshold:X."),
    name: Optional[List[str]] = typer.Option(
        None, "--name", help="Model name per artifact (default from the file name)."
    ),
    overwrite: bool = typer.Option(False, help="Replace an existing repository."),
) -> None:
    """Write a Triton Inference Server model repository (config.pbtxt, versions, manifests)."""
    from hrm_deploy.errors import ConfigError
    from hrm_deploy.serve.repo import Device, OnnxBackend, RepoConfig, write_triton_repo

    try:
        dev = Device(device) if device else None
        backend = OnnxBackend(onnx_backend)
    except ValueError:
        raise ConfigError(
            f"--device is cpu or gpu and --onnx-backend onnxruntime or python, got {device}, {onnx_backend}"
        ) from None
    if trt_accelerator and trt_accelerator.lower() not in ("fp16", "fp32"):
        raise ConfigError(f"--trt-accelerator is fp16 or fp32, got {trt_accelerator}")
    models = write_triton_repo(
        artifacts,
        RepoConfig(
            output=output,
            max_batch=max_batch,
            queue_delay_us=queue_delay_us,
            instances=instances,
            device=dev,
            onnx_backend=backend,
            trt_accelerator=trt_accelerator,
            halt=halt,
            names=tuple(name or ()),
            overwrite=overwrite,
        ),
    )
    for m in models:
        typer.echo(f"{m.name}: {m.kind} ({m.path})")
    typer.echo(f"wrote {output}; serve it with: tritonserver --model-repository {output}")
