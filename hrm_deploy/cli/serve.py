"""``hrm-deploy serve`` and ``hrm-deploy triton-repo``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.choices import Provider, TrtAccelerator
from hrm_deploy.cli.common import user_errors
from hrm_deploy.serve.repo import DEFAULT_QUEUE_DELAY_US, Device, OnnxBackend
from hrm_deploy.serve.server import Batching


@app.command()
@user_errors
def serve(
    artifact: Annotated[
        Path, typer.Argument(help="ONNX graph (ONNX Runtime), engine (TensorRT) or checkpoint (PyTorch).")
    ],
    host: Annotated[str, typer.Option(help="Address to bind; non-loopback needs --allow-remote.")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option(help="HTTP port (KServe v2 protocol).")] = 8000,
    grpc_port: Annotated[int, typer.Option(help="gRPC port.")] = 8001,
    metrics_port: Annotated[int, typer.Option(help="Prometheus metrics port.")] = 8002,
    max_batch: Annotated[int | None, typer.Option(help="Largest batch Triton forms (default: the artifact's).")] = None,
    halt: Annotated[str, typer.Option(help="Early halting: off | q | threshold:X.")] = "off",
    allow_remote: Annotated[
        bool, typer.Option("--allow-remote", help="Allow binding a non-loopback address (no authentication!).")
    ] = False,
    model_name: Annotated[str, typer.Option(help="Model name clients address.")] = "hrm",
    queue_delay_us: Annotated[
        int, typer.Option(help="Dynamic batcher: longest wait for more requests (microseconds).")
    ] = DEFAULT_QUEUE_DELAY_US,
    provider: Annotated[
        Provider | None, typer.Option(help="ONNX Runtime provider for ONNX artifacts (default: cpu).")
    ] = None,
    batching: Annotated[
        Batching,
        typer.Option(
            help="inflight: one ACT loop, requests join/leave at step boundaries (default for step graphs "
            "with --halt); dynamic: Triton's batcher, each batch runs to its end."
        ),
    ] = Batching.auto,
    queue_limit: Annotated[
        int | None,
        typer.Option(help="In-flight: puzzles that may wait for a slot before HTTP 503 (default 8 x max batch)."),
    ] = None,
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
            provider=provider.value if provider else None,
            batching=batching,
            queue_limit=queue_limit,
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
    artifacts: Annotated[list[Path], typer.Argument(help="ONNX graphs and/or engines (with their manifests).")],
    output: Annotated[Path, typer.Option("-o", "--out", "--output", help="Repository folder to write.")],
    max_batch: Annotated[
        int | None, typer.Option(help="max_batch_size (default: engine profile max / export max batch).")
    ] = None,
    queue_delay_us: Annotated[
        int, typer.Option(help="Dynamic batcher: longest wait for more requests (microseconds).")
    ] = DEFAULT_QUEUE_DELAY_US,
    instances: Annotated[int, typer.Option(help="Instances per model (per GPU for GPU models).")] = 1,
    device: Annotated[
        Device | None, typer.Option(help="ONNX graphs: cpu (default) or gpu; engines are always gpu.")
    ] = None,
    onnx_backend: Annotated[
        OnnxBackend, typer.Option(help="python: ONNX Runtime inside Triton's Python backend.")
    ] = OnnxBackend.onnxruntime,
    trt_accelerator: Annotated[
        TrtAccelerator | None,
        typer.Option(case_sensitive=False, help="ONNX on GPU: ONNX Runtime's TensorRT accelerator precision."),
    ] = None,
    halt: Annotated[str, typer.Option(help="Step models' ACT driver: off | q | threshold:X.")] = "off",
    name: Annotated[
        list[str] | None, typer.Option("--name", help="Model name per artifact (default from the file name).")
    ] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing repository.")] = False,
) -> None:
    """Write a Triton Inference Server model repository (config.pbtxt, versions, manifests)."""
    from hrm_deploy.manifest import output_path
    from hrm_deploy.serve.repo import RepoConfig, write_triton_repo

    output = output_path(output, None, folder=True)  # -o NEWDIR/ or NEWDIR: the repository; a file is one line
    models = write_triton_repo(
        artifacts,
        RepoConfig(
            output=output,
            max_batch=max_batch,
            queue_delay_us=queue_delay_us,
            instances=instances,
            device=device,
            onnx_backend=onnx_backend,
            trt_accelerator=trt_accelerator.value if trt_accelerator else None,
            halt=halt,
            names=tuple(name or ()),
            overwrite=overwrite,
        ),
    )
    for m in models:
        typer.echo(f"{m.name}: {m.kind} ({m.path})")
    import shlex

    typer.echo(f"wrote {output}; serve it with: tritonserver --model-repository {shlex.quote(str(output))}")
