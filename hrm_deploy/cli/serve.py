"""``hrm-deploy serve`` and ``hrm-deploy triton-repo``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hrm_deploy.cli import app
from hrm_deploy.cli.choices import Provider, TrtAccelerator
from hrm_deploy.cli.common import Ray, RayAddress, ray_config, user_errors
from hrm_deploy.errors import ConfigError
from hrm_deploy.serve.repo import DEFAULT_QUEUE_DELAY_US, Device, OnnxBackend, RepoBatching
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
    ray: Ray = False,
    address: RayAddress = None,
    replicas: Annotated[
        int | None, typer.Option(help="With --ray: model replicas, each owning one ACT loop (default 1).")
    ] = None,
    autoscale: Annotated[
        str | None,
        typer.Option(help="With --ray: MIN:MAX replicas, scaled on ongoing requests (a full ACT loop per replica)."),
    ] = None,
) -> None:
    """Serve an artifact on PyTriton's Triton Inference Server (or, with --ray, on Ray Serve) until
    Ctrl-C / SIGTERM."""
    from hrm_deploy.serve.server import ServeConfig, main_ready_line, serve as run_server

    scale = ray_config(ray, address, None)
    if scale is None and (replicas is not None or autoscale is not None):
        raise ConfigError("--replicas and --autoscale apply with --ray; add --ray or drop them")
    config = ServeConfig(
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
    )
    if scale is not None:
        from hrm_deploy.scale.serving import Replicas, serve_on_ray

        if grpc_port != 8001 or queue_delay_us != DEFAULT_QUEUE_DELAY_US:
            raise ConfigError(
                "--grpc-port and --queue-delay-us are Triton's; with --ray the ingress speaks HTTP and Ray Serve batches"
            )
        raise typer.Exit(serve_on_ray(config, scale, Replicas.parse(replicas, autoscale), ready=main_ready_line))
    code = run_server(
        config,
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
    halt: Annotated[
        str | None,
        typer.Option(help="Step models' ACT driver: off | q | threshold:X (a loop graph keeps its export's rule)."),
    ] = None,
    batching: Annotated[
        RepoBatching,
        typer.Option(
            help="Step models: inflight (one ACT step per execute, unfinished requests rescheduled; the default "
            "with --halt), dynamic (each batch runs to its slowest puzzle)."
        ),
    ] = RepoBatching.auto,
    triton_version: Annotated[
        str | None,
        typer.Option(help="The Triton the repository is for (2.51 or NGC 24.10); before 2.41 no in-flight driver."),
    ] = None,
    kserve: Annotated[
        bool, typer.Option("--kserve", help="Also write kserve.yaml (ServingRuntime + InferenceService).")
    ] = False,
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
            batching=batching,
            triton_version=triton_version,
            kserve=kserve,
        ),
    )
    for note in dict.fromkeys(m.note for m in models if m.note):
        typer.echo(f"note: {note}", err=True)
    for m in models:
        typer.echo(f"{m.name}: {m.kind} ({m.path})")
    import shlex

    typer.echo(f"wrote {output}; serve it with: tritonserver --model-repository {shlex.quote(str(output))}")
