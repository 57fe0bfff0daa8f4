"""Ray for hrm-deploy: join a cluster (``--address auto`` or ``ray://HOST:PORT``) or start a local one on
127.0.0.1 and stop it afterwards, and the resources each worker asks for.

A worker is one process holding one runner: a GPU artifact (a TensorRT engine, a CUDA ``.pt2``) asks
for one GPU, so one command uses every GPU of the cluster; a CPU artifact asks for ``threads`` CPUs and
its runner uses that many threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from hrm_deploy.errors import ConfigError, DependencyError, install_hint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RayConfig:
    """Where to run and how wide: ``address`` None starts a local Ray (stopped afterwards), ``auto`` joins
    the cluster this machine belongs to, ``ray://HOST:PORT`` a remote one; ``workers`` None: as many as
    the cluster's CPUs (or GPUs, for GPU artifacts) allow; ``threads`` per CPU worker."""

    address: str | None = None
    workers: int | None = None
    threads: int = 1

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"--workers must be >= 1, got {self.workers}")
        if self.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {self.threads}")
        if self.address is not None and self.address != "auto" and not self.address.startswith("ray://"):
            raise ConfigError(f"--address {self.address!r}: give auto (this machine's cluster) or ray://HOST:PORT")


def ray_module() -> ModuleType:
    """``import ray``, or one line naming the install command."""
    try:
        import ray
    except ImportError:
        raise DependencyError(f"--ray needs Ray; install it with {install_hint('scale')}") from None
    return ray


@contextlib.contextmanager
def connected(config: RayConfig, metrics_port: int | None = None) -> Iterator[ModuleType]:
    """Ray, connected for the block: a local instance (127.0.0.1, no dashboard; its Prometheus metrics
    on ``metrics_port``) started and stopped here, or the cluster at ``config.address`` (left running)."""
    ray = ray_module()
    if ray.is_initialized():  # a caller (a test, a notebook) already connected: use it, leave it
        yield ray
        return
    options: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False}
    if config.address is None:  # a private instance: its start-up chatter (token, dashboard) stays quiet
        options.update(_node_ip_address="127.0.0.1", num_cpus=os.cpu_count() or 1, logging_level=logging.ERROR)
        if metrics_port is not None:
            options["_metrics_export_port"] = metrics_port
    else:
        options["address"] = config.address
    ours = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    try:
        ray.init(**options)
    except ConnectionError as exc:
        raise ConfigError(f"--address {config.address}: no Ray cluster answers there ({exc})") from None
    if ours is not None:  # ray.init installs a SIGTERM handler that ends the process at once: the command's own stays
        signal.signal(signal.SIGTERM, ours)
    try:
        yield ray
    finally:
        ray.shutdown()


def needs_gpu(artifact: Path) -> bool:
    """Whether a worker of ``artifact`` needs a GPU: TensorRT engines, and PyTorch engines built for CUDA."""
    from hrm_deploy.manifest import manifest_path, read_manifest
    from hrm_deploy.registry import artifact_kind

    kind = artifact_kind(artifact)
    if kind == "engine":
        return True
    if kind == "pt2" and manifest_path(artifact).is_file():
        return str(read_manifest(artifact).get("device", "cpu")).startswith("cuda")
    return False


def worker_resources(ray: ModuleType, artifact: Path, config: RayConfig) -> tuple[dict[str, float], int]:
    """(the resources one worker asks for, how many workers to start)."""
    gpu = needs_gpu(artifact)
    available = ray.cluster_resources()
    if gpu:
        have = int(available.get("GPU", 0))
        if not have:
            raise ConfigError(
                f"{artifact.name} runs on a GPU and the Ray cluster has none; use an ONNX export or a --target cpu build"
            )
        return {"num_gpus": 1, "num_cpus": 1}, min(config.workers or have, have)
    cpus = int(available.get("CPU", 1))
    fits = max(1, cpus // config.threads)
    return {"num_cpus": config.threads}, config.workers or fits
