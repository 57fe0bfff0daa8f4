"""``serve ARTIFACT --ray``: the artifact behind Ray Serve, as replicas that autoscale and survive a lost one.

Two deployments make one application:

- **model** (``--replicas N`` or ``--autoscale MIN:MAX``, autoscaled on ongoing requests): each replica
  loads the artifact once and owns what ``serve`` would run (:func:`hrm_deploy.serve.server.build_inference`):
  the in-flight ACT loop for step artifacts with a halting rule, requests joining and leaving at step
  boundaries, or a batch function behind Ray Serve's own dynamic batching (``@serve.batch``) for unrolled
  and loop graphs. A replica asks for one GPU (GPU artifacts) or ``threads`` CPUs.
- **ingress**: the KServe v2 HTTP protocol as tritonserver speaks it (JSON or the binary-data extension,
  ``/v2/models/<name>/config``, health and metadata), so ``solve --url``, ``arc-eval URL`` and ``bench``
  work unchanged; every request checked as ``serve``'s front checks it (:func:`hrm_deploy.serve.front.check_infer_request`,
  one line, HTTP 400) before a replica sees it. An inference whose replica died is sent again to a live
  one (it is a pure function of its request); past capacity the answer is HTTP 503 with ``Retry-After``.

HTTP framing, connections and deadlines are Ray Serve's proxy's (uvicorn). Prometheus metrics: Ray Serve's
and the ACT loop's gauges (``ray_hrm_act_*``, per replica) on Ray's metrics port.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import numpy as np

from hrm_deploy.errors import ConfigError, InternalError
from hrm_deploy.scale.cluster import RayConfig, connected, worker_resources
from hrm_deploy.serve.server import ServeConfig

log = logging.getLogger(__name__)

APP = "hrm"
RETRIES = 3  # an inference whose replica died is sent again this many times
RETRY_AFTER_S = 1
POLL_S = 0.002  # how often a replica's request looks whether the ACT loop has answered it
GAUGE_EVERY_S = 1.0
GRACE_S = 10.0  # at a stop, a replica's requests still running get this long to finish


@dataclass(frozen=True)
class Replicas:
    """How many model replicas: ``count`` fixed, or ``autoscale`` (min, max) on ongoing requests per replica
    (``target`` each; default the model's max batch: a replica's ACT loop full)."""

    count: int = 1
    autoscale: tuple[int, int] | None = None
    target: float | None = None
    # how fast the autoscaler reacts (seconds): Ray Serve's defaults are 30 s up and 600 s down
    upscale_delay_s: float = 5.0
    downscale_delay_s: float = 30.0

    @classmethod
    def parse(cls, replicas: int | None, autoscale: str | None) -> Replicas:
        """``--replicas N`` or ``--autoscale MIN:MAX`` (not both)."""
        if replicas is not None and autoscale is not None:
            raise ConfigError("give --replicas N or --autoscale MIN:MAX, not both")
        if autoscale is None:
            count = 1 if replicas is None else replicas
            if count < 1:
                raise ConfigError(f"--replicas must be >= 1, got {count}")
            return cls(count)
        try:
            low, high = (int(x) for x in autoscale.split(":"))
        except ValueError:
            raise ConfigError(f"--autoscale {autoscale!r}: give MIN:MAX replicas, e.g. 1:4") from None
        if not 1 <= low <= high:
            raise ConfigError(f"--autoscale {autoscale}: give 1 <= MIN <= MAX")
        return cls(autoscale=(low, high))

    def options(self, max_batch: int) -> dict[str, Any]:
        """Ray Serve deployment options for the model."""
        if self.autoscale is None:
            return {"num_replicas": self.count}
        low, high = self.autoscale
        return {
            "autoscaling_config": {
                "min_replicas": low,
                "max_replicas": high,
                "target_ongoing_requests": self.target or max_batch,
                "upscale_delay_s": self.upscale_delay_s,
                "downscale_delay_s": self.downscale_delay_s,
                "look_back_period_s": 2.0,
                "metrics_interval_s": 0.5,
            }
        }


def model_class(serve: ModuleType, max_batch: int) -> type:
    """The model deployment's class (made here: Ray Serve's batching decorator takes the max batch)."""

    class ActModel:
        """One replica: the artifact loaded once, its in-flight loop or batch function."""

        def __init__(self, config: ServeConfig, threads: int):
            from hrm_deploy.backends import open_runner
            from hrm_deploy.registry import runner_options
            from hrm_deploy.runtime.artifact import read_contract
            from hrm_deploy.serve.server import build_inference, halt_function

            contract = read_contract(config.artifact)
            halt = halt_function(config.halt, config.artifact)
            options = runner_options(config.artifact, provider=config.provider, threads=threads)
            self.runner = open_runner(config.artifact, **options)
            self.runner.activate()
            self.inference = build_inference(config, self.runner, contract, halt, max_batch)
            self.replica = serve.get_replica_context().replica_tag
            self.gauges: dict[str, Any] = {}
            self.last_gauges = 0.0

        async def infer(self, tokens: np.ndarray, ids: np.ndarray, limit_s: float) -> dict[str, Any]:
            """``{"outputs": ..., "replica": ...}`` or ``{"status": ..., "error": ..., "retry_after": ...}``."""
            from hrm_deploy.serve.wire import split_outputs

            if self.inference.batch is not None:
                return {"outputs": await self._batched((tokens, ids)), "replica": self.replica}
            from hrm_deploy.serve.inflight import Busy

            try:
                ticket = self.inference.scheduler.submit(tokens, ids, deadline=time.monotonic() + limit_s)
            except Busy as busy:
                return {"status": 503, "error": str(busy), "retry_after": max(1, busy.retry_after_s)}
            try:
                while not ticket.done.is_set():
                    await asyncio.sleep(POLL_S)
            except asyncio.CancelledError:  # the client went away: its rows leave the loop at the next step
                ticket.cancel()
                raise
            self._publish()
            if ticket.error is not None:
                return {"status": ticket.status, "error": ticket.error}
            (outputs,) = split_outputs(ticket.outputs(), [len(tokens)], self.inference.shape.act_steps)
            return {"outputs": outputs, "replica": self.replica}

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=0.002)
        async def _batched(self, requests: list[tuple[np.ndarray, np.ndarray]]) -> list[dict[str, np.ndarray]]:
            """Dynamic batching (unrolled and loop graphs): Ray Serve gathers requests, one runner call answers them."""
            rows = [{"inputs": t, "puzzle_identifiers": p.reshape(-1, 1)} for t, p in requests]
            batch = self.inference.batch
            assert batch is not None  # infer's branch
            return await asyncio.to_thread(batch, rows)

        def _publish(self) -> None:
            """The ACT loop's gauges to Ray's metrics (``ray_hrm_act_<gauge>{replica=...}``), once a second."""
            now = time.monotonic()
            if now - self.last_gauges < GAUGE_EVERY_S:
                return
            self.last_gauges = now
            from ray.util.metrics import Gauge

            for name, value in self.inference.scheduler.gauges().items():
                if name not in self.gauges:
                    self.gauges[name] = Gauge(f"hrm_act_{name}", description=f"ACT loop: {name}", tag_keys=("replica",))
                self.gauges[name].set(float(value), tags={"replica": self.replica})

        def __del__(self) -> None:
            inference = getattr(self, "inference", None)
            if inference is not None:
                inference.stop()
            runner = getattr(self, "runner", None)
            if runner is not None:
                runner.close()

    return ActModel


class Ingress:
    """The KServe v2 HTTP protocol in front of the model deployment (``handle``), requests checked first."""

    def __init__(self, handle: Any, limits: Any, steps: int, vocab_size: int, timeout_s: float = 600.0):
        self.model, self.limits, self.steps, self.vocab_size = handle, limits, steps, vocab_size
        self.timeout_s = timeout_s

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import Response

        path = request.url.path.rstrip("/")
        name = self.limits.model_name
        if request.method == "GET":
            found = self._get(path, name)
            if found is None:
                return self._error(404, f"no such endpoint: {request.method} {request.url.path}")
            return Response(json.dumps(found), media_type="application/json")
        if request.method != "POST":
            return self._error(501, f"method {request.method} is not supported; use GET or POST")
        if not path.startswith("/v2/models/") or not path.endswith("/infer"):
            return self._error(404, f"no such endpoint: POST {request.url.path}")
        asked = path.split("/")[3]
        if asked != name:
            return self._error(404, f"Request for unknown model: '{asked}' is not found")
        return await self._infer(request)

    def _get(self, path: str, name: str) -> dict[str, Any] | None:
        """The answer to a GET (health, server and model metadata, the model's config); None: not found."""
        from hrm_deploy import __version__

        if path in ("/v2/health/live", "/v2/health/ready", f"/v2/models/{name}/ready"):
            return {}
        if path == "/v2":
            return {
                "name": "hrm-deploy",
                "version": __version__,
                "extensions": ["binary_tensor_data", "model_configuration"],
            }
        s, v, t = self.limits.seq_len, self.vocab_size, self.steps
        tensors = [("answer", "INT32", [s]), ("logits", "FP32", [s, v]), ("q_halt_logits", "FP32", [t])]
        tensors += [("steps", "INT32", [1]), ("act_steps", "INT32", [1])]
        inputs = [("inputs", "INT32", [s]), ("puzzle_identifiers", "INT32", [1])]
        if path == f"/v2/models/{name}":
            return {
                "name": name,
                "versions": ["1"],
                "platform": "hrm-deploy on Ray Serve",
                "inputs": [{"name": n, "datatype": d, "shape": [-1, *dims]} for n, d, dims in inputs],
                "outputs": [{"name": n, "datatype": d, "shape": [-1, *dims]} for n, d, dims in tensors],
            }
        if path == f"/v2/models/{name}/config":
            return {
                "name": name,
                "max_batch_size": self.limits.max_batch,
                "input": [{"name": n, "data_type": f"TYPE_{d}", "dims": dims} for n, d, dims in inputs],
                "output": [{"name": n, "data_type": f"TYPE_{d}", "dims": dims} for n, d, dims in tensors],
            }
        return None

    async def _infer(self, request: Any) -> Any:
        from starlette.responses import Response

        from hrm_deploy.serve.front import Refused, byte_count, check_infer_request
        from hrm_deploy.serve.wire import RequestError, decode_request, encode_response, parameters

        try:
            headers = _Headers(request.headers)
            length = byte_count(headers, "Content-Length")
            if length is not None and length > self.limits.max_body():
                raise Refused(
                    413,
                    f"the request body of {length} bytes exceeds this server's limit of {self.limits.max_body()} bytes (max batch {self.limits.max_batch}); send smaller batches",
                )
            body = await request.body()
            header_length = byte_count(headers, "Inference-Header-Content-Length")
            checked = check_infer_request(body, header_length, self.limits)
            arrays = decode_request(checked, body, header_length)
        except Refused as refused:
            return self._error(refused.status, str(refused), refused.headers)
        except RequestError as exc:
            return self._error(400, str(exc))
        tokens, ids = arrays["inputs"], arrays["puzzle_identifiers"].reshape(-1)
        limit_s = self.timeout_s
        timeout_us = parameters(checked).get("timeout")
        if isinstance(timeout_us, int) and not isinstance(timeout_us, bool) and timeout_us > 0:
            limit_s = min(limit_s, timeout_us / 1e6)
        result = await self._call(tokens, ids, limit_s)
        if "error" in result:
            extra = {"Retry-After": str(result["retry_after"])} if result.get("retry_after") else {}
            return self._error(result["status"], result["error"], extra)
        body_out, headers_out = encode_response(checked, self.limits.model_name, result["outputs"])
        return Response(body_out, headers={**headers_out, "hrm-replica": result["replica"]})

    async def _call(self, tokens: np.ndarray, ids: np.ndarray, limit_s: float) -> dict[str, Any]:
        """The model's answer; an inference whose replica died is sent again (a live replica takes it)."""
        import ray
        from ray.serve.exceptions import BackPressureError

        lost = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
        for attempt in range(RETRIES + 1):
            try:
                result = dict(await self.model.infer.remote(tokens, ids, limit_s))
                if (
                    result.get("status") == 503 and attempt < RETRIES
                ):  # that replica's queue was full: another may not be
                    await asyncio.sleep(0.02 * (attempt + 1))
                    continue
                return result
            except BackPressureError:
                return {"status": 503, "error": "every replica is busy; retry later", "retry_after": RETRY_AFTER_S}
            except lost as exc:
                if attempt == RETRIES:
                    return {
                        "status": 503,
                        "error": f"the model's replicas keep failing ({type(exc).__name__}); retry later",
                        "retry_after": RETRY_AFTER_S,
                    }
                log.warning("a replica was lost (%s); sending the request to another", type(exc).__name__)
                await asyncio.sleep(0.1 * (attempt + 1))
        raise AssertionError("unreachable")

    @staticmethod
    def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Any:
        from starlette.responses import Response

        return Response(
            json.dumps({"error": message}), status_code=status, media_type="application/json", headers=headers
        )


class _Headers:
    """A Starlette request's headers as :func:`hrm_deploy.serve.front.byte_count` reads them (every value of a name)."""

    def __init__(self, headers: Any):
        self.headers = headers

    def getall(self, name: str, default: list[str]) -> list[str]:
        return list(self.headers.getlist(name)) or default


def serve_on_ray(
    config: ServeConfig,
    ray_config: RayConfig,
    replicas: Replicas,
    *,
    ready: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Serve ``config.artifact`` on Ray Serve until SIGINT/SIGTERM (or ``stop`` is set); returns an exit code.

    A local Ray (and its Serve) is started and stopped here; on a cluster joined with ``--address`` only
    this application is removed. Blocks."""
    from hrm_deploy.runtime.artifact import read_contract
    from hrm_deploy.serve.front import Limits
    from hrm_deploy.serve.server import OUTPUTS, check_bind, check_max_batch, check_ports_free, check_queue_limit

    check_bind(config)
    check_ports_free(config)
    contract = read_contract(config.artifact)
    max_batch = check_max_batch(config.max_batch, contract.max_batch, config.artifact.name)
    check_queue_limit(config.queue_limit, max_batch)
    bounds = (("inputs", contract.vocab_size), ("puzzle_identifiers", contract.num_puzzle_identifiers))
    limits = Limits(config.model_name, contract.seq_len, max_batch, outputs=OUTPUTS, bounds=bounds)
    stop = stop or threading.Event()
    previous: dict[int, Any] = {}
    try:
        with connected(ray_config, metrics_port=config.metrics_port) as ray:
            previous = _stop_on_signals(stop)  # after ray.init, which installs a SIGTERM handler of its own
            from ray import serve

            logging.getLogger("ray.serve").setLevel(logging.WARNING)  # its start-up lines: ours says what serves
            resources, _ = worker_resources(ray, config.artifact, ray_config)
            queue = config.queue_limit or 8 * max_batch
            serve.start(http_options={"host": config.host, "port": config.http_port})
            _check_http(config)
            model: Any = serve.deployment(
                model_class(serve, max_batch),
                name="model",
                ray_actor_options=resources,
                # a replica takes as many requests as its ACT loop has slots and queue (past them the loop itself
                # answers 503); requests still being routed wait at the ingress, bounded too
                max_ongoing_requests=max_batch + queue,
                max_queued_requests=4 * (max_batch + queue),
                graceful_shutdown_timeout_s=GRACE_S,
                graceful_shutdown_wait_loop_s=0.2,
                **replicas.options(max_batch),
            )
            ingress: Any = serve.deployment(
                Ingress, name="ingress", ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4 * (max_batch + queue)
            )
            app = ingress.bind(
                model.bind(replace(config, max_batch=max_batch), ray_config.threads),
                limits,
                contract.steps,
                contract.vocab_size,
            )
            serve.run(app, name=APP, route_prefix="/", blocking=False)
            if ready is not None:
                ready(_ready_line(config, replicas, resources, max_batch))
            while not stop.wait(0.5):
                pass
            started = time.monotonic()
            serve.delete(APP)  # replicas finish the requests they hold (GRACE_S at most), then go
            log.info("stopped the application in %.1f s", time.monotonic() - started)
            # a local Ray (and its Serve) ends with the block; a joined cluster keeps its own Serve
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _stop_on_signals(stop: threading.Event) -> dict[int, Any]:
    """SIGINT/SIGTERM set ``stop`` (main thread only); the handlers replaced."""
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda signum, frame: stop.set())
    return previous


def _check_http(config: ServeConfig) -> None:
    """Ray Serve has one HTTP proxy per cluster: where it already runs (a joined cluster, a notebook's
    Ray) with another host or port, ``serve.start`` keeps those, and the application would answer
    somewhere other than the line we print. Refuse instead, naming what runs."""
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    if client is None:  # serve.start has just returned: its controller runs
        raise InternalError("Ray Serve's controller is not running after serve.start")
    running = client.http_config
    if (running.host, running.port) != (config.host, config.http_port):
        raise ConfigError(
            f"Ray Serve already runs on this cluster with its HTTP proxy on {running.host}:{running.port} "
            f"(one per cluster); pass --host {running.host} --http-port {running.port}, "
            "or stop it first (`serve shutdown`)"
        )


def _ready_line(config: ServeConfig, replicas: Replicas, resources: dict[str, float], max_batch: int) -> str:
    scale = (
        f"{replicas.count} replica(s)"
        if replicas.autoscale is None
        else "autoscaling {}..{} replicas".format(*replicas.autoscale)
    )
    return (
        f"serving {config.artifact.name} as model '{config.model_name}' on Ray Serve ({scale}, {resources} each, max "
        f"batch {max_batch}) on http://{config.host}:{config.http_port}; Prometheus metrics on "
        f"http://127.0.0.1:{config.metrics_port}/metrics"
    )
