"""``hrm-deploy serve``: one artifact behind PyTriton's bundled Triton Inference Server.

Two batching modes (:class:`Batching`). **In-flight** (the default for step artifacts with a halt
rule): one ACT loop (:mod:`hrm_deploy.serve.inflight`) that requests join and leave at step
boundaries; the checking front answers HTTP inference itself, each request alone
(:mod:`hrm_deploy.serve.endpoint`), and Triton serves health, metadata, metrics and gRPC.
**Dynamic** (unrolled graphs and engines, ``--halt off``, ``--batching dynamic``), described below:

Triton's dynamic batcher gathers single-puzzle requests into batches; the bound inference
function validates each request, runs our runner (:func:`hrm_deploy.backends.open_runner`) once
on the whole batch and splits the answers. Per request (batch dimension ``B`` added by Triton):

- inputs: ``inputs`` int32 [S] (tokens 0..vocab-1), ``puzzle_identifiers`` int32 [1];
- outputs: ``answer`` int32 [S] (argmax of the final logits), ``logits`` float32 [S, V],
  ``q_halt_logits`` float32 [steps], ``steps`` int32 [1] (ACT steps run), ``act_steps`` int32 [1]
  (the ACT steps the model runs without halting: a client that needs every step, such as
  ``arc-eval``, tells from it whether the server halts early).

Every HTTP request passes the checking front (:mod:`hrm_deploy.serve.front`: body size, JSON,
dtypes, shapes, batch bounds, data sizes) before tritonserver, on a private port, sees it;
out-of-vocabulary tokens, unknown puzzle ids and empty requests are refused by the function with
an error naming the problem (HTTP 400, see :func:`hrm_deploy.serve.binding.request_errors_as_400`). An
error fails every request of the batch Triton formed (PyTriton answers per batch), the server
keeps serving. Ports in use, ``--max-batch`` beyond the artifact's own maximum and model names
that are not plain names are refused before anything starts.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.errors import ConfigError, require
from hrm_deploy.serve.front import Front, Limits
from hrm_deploy.serve.listener import raise_open_file_limit
from hrm_deploy.serve.wire import (
    RequestError as RequestError,  # re-exported (the proxy patch matches its name)
    check_requests,
    split_outputs,
)

LOOPBACK_NAMES = ("localhost",)
MODEL_NAME = "hrm"
# Long enough to gather concurrent requests into one batch, short next to one CPU inference (ms).
DEFAULT_QUEUE_DELAY_US = 2000
MAX_QUEUE_DELAY_US = 1_000_000
OUTPUTS = ("answer", "logits", "q_halt_logits", "steps", "act_steps")


class Batching(str, Enum):
    """How concurrent requests share the model: ``inflight`` (one ACT loop, requests join and leave at
    step boundaries), ``dynamic`` (Triton's batcher, each batch runs to its end), ``auto`` (in-flight
    for step artifacts with a halt rule, dynamic otherwise)."""

    auto = "auto"
    inflight = "inflight"
    dynamic = "dynamic"


DRAIN_GRACE_S = 10.0  # SIGTERM: running puzzles get this long to finish
MONITOR_S = 1.0  # how often a serving process looks whether tritonserver is still alive


@dataclass(frozen=True)
class ServeConfig:
    """Options of ``hrm-deploy serve``; ports 0 are not allowed by Triton, so every port is explicit."""

    artifact: Path
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    max_batch: int | None = None  # default: the artifact's max batch (engine profile / export)
    halt: str = "off"  # off | q | threshold:X (rules of hrm_deploy.halting)
    allow_remote: bool = False
    model_name: str = MODEL_NAME
    queue_delay_us: int = DEFAULT_QUEUE_DELAY_US
    provider: str | None = None  # ORT provider for ONNX artifacts (cpu, cuda, tensorrt)
    batching: Batching = Batching.auto
    queue_limit: int | None = None  # in-flight: queued puzzles before HTTP 503 (default 8 x max batch)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost'."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(config: ServeConfig) -> None:
    """Refuse a non-loopback bind unless ``allow_remote`` says it is meant."""
    if not is_loopback(config.host) and not config.allow_remote:
        raise ConfigError(
            f"--host {config.host} would expose the server beyond this machine; add --allow-remote "
            "if that is meant (there is no authentication), or bind 127.0.0.1"
        )
    ports = [config.http_port, config.grpc_port, config.metrics_port]
    if len(set(ports)) != 3 or not all(0 < p < 65536 for p in ports):
        raise ConfigError(f"HTTP, gRPC and metrics ports must be three different ports in 1..65535, got {ports}")
    if not 0 <= config.queue_delay_us <= MAX_QUEUE_DELAY_US:
        raise ConfigError(
            f"--queue-delay-us must be in 0..{MAX_QUEUE_DELAY_US} (one second), got {config.queue_delay_us}"
        )
    from hrm_deploy.serve.repo import check_model_name

    check_model_name(config.model_name)


def check_ports_free(config: ServeConfig) -> None:
    """Refuse, before loading anything, a port another process (another ``serve``) listens on."""
    import socket

    for flag, port in (
        ("--http-port", config.http_port),
        ("--grpc-port", config.grpc_port),
        ("--metrics-port", config.metrics_port),
    ):
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT of a stopped server is fine
            try:
                probe.bind((config.host, port))
            except OSError as exc:
                raise ConfigError(
                    f"{flag} {port} on {config.host} is in use ({exc.strerror}; another server?); stop it or "
                    f"choose another {flag}"
                ) from None


def check_max_batch(requested: int | None, artifact_max: int, name: str) -> int:
    """The batch Triton may form: the artifact's own maximum unless a smaller one is asked for;
    more is refused (its buffers would be sized for a batch the artifact was not made for)."""
    max_batch = artifact_max if requested is None else requested
    if not 1 <= max_batch <= artifact_max:
        raise ConfigError(
            f"--max-batch {max_batch}: give 1..{artifact_max}, the largest batch {name} was made for "
            "(export or build it with a larger --max-batch for more)"
        )
    return max_batch


def check_queue_limit(queue_limit: int | None, max_batch: int) -> None:
    """In-flight: a queue smaller than the largest request would refuse that request forever."""
    if queue_limit is not None and queue_limit < max_batch:
        raise ConfigError(
            f"--queue-limit {queue_limit}: give at least the max batch ({max_batch}) so that every "
            "request the server takes fits in an empty queue"
        )


def halt_function(halt: str, artifact: str | Path | None = None) -> Callable[..., Any] | None:
    """The runner's ``halt=`` callback for a ``--halt`` rule; None for "off" (all ACT steps).
    ``q`` is the rule ``artifact``'s model was trained with (TRM: ``q_halt > 0``; HRM:
    ``q_halt > q_continue``), as ``solve`` and ``verify`` use it.

    The rules live in ``hrm_deploy.halting`` (imported only when a rule is asked for)."""
    if halt == "off":
        return None
    from hrm_deploy.halting import HaltRule, resolve_rule

    rule = HaltRule.parse(halt)
    return (resolve_rule(rule, str(artifact)) if artifact is not None else rule).should_halt


class BatchInfer:
    """The inference function bound into Triton: validates, batches into one runner call, splits.

    Called by PyTriton with a list of requests (mapping input name -> array with the batch axis);
    returns one dict of outputs per request."""

    def __init__(
        self,
        runner: Any,
        *,
        seq_len: int,
        vocab_size: int,
        num_puzzle_identifiers: int,
        halt: Callable[..., Any] | None = None,
        act_steps: int | None = None,
    ):
        self.runner, self.seq_len, self.vocab_size = runner, seq_len, vocab_size
        self.num_puzzle_identifiers, self.halt = num_puzzle_identifiers, halt
        self.act_steps = act_steps  # answered as the "act_steps" output when given
        self.batches: list[int] = []  # batch sizes run (kept short: for tests and the benchmark)

    def __call__(self, requests: list[Any]) -> list[dict[str, np.ndarray]]:
        checked = check_requests(requests, self.seq_len, self.vocab_size, self.num_puzzle_identifiers)
        feeds = {
            "inputs": np.concatenate([t for t, _ in checked]),
            "puzzle_identifiers": np.concatenate([p for _, p in checked]),
        }
        out = self.runner.infer(feeds) if self.halt is None else self.runner.infer(feeds, halt=self.halt)
        self.batches = (self.batches + [len(feeds["inputs"])])[-1000:]
        return split_outputs(out, [t.shape[0] for t, _ in checked], self.act_steps)


def _private_port() -> int:
    """A free TCP port on 127.0.0.1 for tritonserver's own HTTP endpoint (behind the front)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _runner_options(config: ServeConfig) -> dict[str, Any]:
    from hrm_deploy.registry import runner_options

    return runner_options(config.artifact, provider=config.provider)


def inflight_step(runner: Any, manifest: dict[str, Any] | None, config: ServeConfig, halt: Any) -> Any | None:
    """The step function in-flight batching drives, or None for dynamic batching.

    ``auto`` picks in-flight for a runner with a step function (ONNX step graphs, step engines, checkpoints)
    and a halt rule, and says in one log line why not otherwise; ``inflight`` asked for explicitly
    refuses (one line) what it cannot serve."""
    from hrm_deploy.serve.inflight import batch_independent

    if config.batching is Batching.dynamic or (config.batching is Batching.auto and halt is None):
        return None
    why = batch_independent(manifest)
    if why is None and (manifest or {}).get("mode") == "loop":
        why = (
            f"{config.artifact.name} is a loop graph (the ACT loop inside one call, halting by the rule fixed at its "
            "export), so its puzzles cannot join or leave between steps; serve the step graph (`hrm-deploy export "
            "--mode step`) with --halt for in-flight batching, or this graph with --batching dynamic"
        )
    step_function = getattr(runner, "step_function", None)
    if why is None and step_function is None:
        why = (
            f"the {runner.name} runner has no step function; serve a step artifact (an ONNX step graph, a step "
            "engine or a checkpoint) for in-flight batching"
        )
    step_fn = None
    if why is None and step_function is not None:
        try:
            step_fn = step_function()
        except ConfigError as exc:
            why = str(exc)
    if why is not None:
        if config.batching is Batching.inflight:
            raise ConfigError(f"--batching inflight: {why}")
        logging.getLogger(__name__).info("dynamic batching: %s", why)
    return step_fn


@dataclass
class Inference:
    """What answers the served model's requests, warmed up: ``batch`` (dynamic batching: each batch runs
    to its end) or ``scheduler`` (in-flight: one ACT loop requests join and leave), and the shape
    requests are checked against. ``serve`` binds it into Triton; a Ray Serve replica holds one."""

    shape: Any  # hrm_deploy.serve.endpoint.ModelShape
    batch: BatchInfer | None = None
    scheduler: Any = None  # hrm_deploy.serve.inflight.InflightScheduler

    def stop(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop(0)


def build_inference(config: ServeConfig, runner: Any, contract: Any, halt: Any, max_batch: int) -> Inference:
    """The batch function or the in-flight loop for ``runner`` (activated), as ``config`` asks, warmed up."""
    from hrm_deploy.serve.endpoint import ModelShape

    zeros = {"inputs": np.zeros((1, contract.seq_len), np.int32), "puzzle_identifiers": np.zeros((1, 1), np.int32)}
    step_fn = inflight_step(runner, contract.manifest, config, halt)
    steps = contract.steps if step_fn is None else step_fn.steps
    shape = ModelShape(config.model_name, contract.seq_len, contract.vocab_size, contract.num_puzzle_identifiers, steps)
    if step_fn is None:
        batch = BatchInfer(
            runner,
            seq_len=contract.seq_len,
            vocab_size=contract.vocab_size,
            num_puzzle_identifiers=contract.num_puzzle_identifiers,
            halt=halt,
            act_steps=contract.steps,
        )
        # One puzzle of padding before serving: warms the runner up and surfaces a bad combination
        # (e.g. --halt on an unrolled graph) as one error line now, not on every request.
        batch([zeros])
        _warm_buckets(runner, max_batch)
        return Inference(shape, batch=batch)
    from hrm_deploy.serve.inflight import InflightScheduler

    _warm_buckets(step_fn, max_batch)  # before the scheduler's thread owns it
    scheduler = InflightScheduler(step_fn, halt, max_batch, config.queue_limit or 8 * max_batch)
    return Inference(shape, scheduler=scheduler)


def _inference(config: ServeConfig, runner: Any, contract: Any, halt: Any, max_batch: int) -> tuple[Any, Any]:
    """(the function bound into Triton, the front's in-flight endpoint or None), warmed up."""
    from hrm_deploy.serve.endpoint import InflightEndpoint, InflightInfer

    built = build_inference(config, runner, contract, halt, max_batch)
    if built.scheduler is None:
        return built.batch, None
    infer = InflightInfer(built.scheduler, built.shape)
    try:
        zeros = {"inputs": np.zeros((1, contract.seq_len), np.int32), "puzzle_identifiers": np.zeros((1, 1), np.int32)}
        infer([zeros])  # warm-up through the loop
    except BaseException:
        built.stop()
        raise
    return infer, InflightEndpoint(built.scheduler, built.shape)


def _warm_buckets(target: Any, max_batch: int) -> None:
    """Every batch bucket a request can land in, run once before serving (engines: plans,
    captures, a fallback's compiles), so no first request of a new size waits for them."""
    warm_up = getattr(target, "warm_up", None)
    if warm_up is not None:
        sizes = warm_up(max_batch)
        logging.getLogger(__name__).info("warmed up batch buckets %s", sizes)


def serve(config: ServeConfig, *, ready: Callable[[str], None] | None = None) -> int:
    """Serve ``config.artifact`` until SIGINT/SIGTERM (or Triton dies); returns an exit code.

    Blocks. ``ready`` is called with a one-line description once the server answers. On SIGTERM
    the in-flight loop answers what it finishes within :data:`DRAIN_GRACE_S` and fails the rest."""
    check_bind(config)
    halt = halt_function(config.halt, config.artifact)
    from hrm_deploy.backends import open_runner
    from hrm_deploy.runtime.artifact import read_contract
    from hrm_deploy.serve import binding

    check_ports_free(config)  # the user's options are checked first: they are wrong with or without the extra
    contract = read_contract(config.artifact)
    max_batch = check_max_batch(config.max_batch, contract.max_batch, config.artifact.name)
    check_queue_limit(config.queue_limit, max_batch)
    pytriton_triton = require("pytriton.triton", "serve", "hrm-deploy serve")
    # Each client connection is a descriptor: the soft limit (often 1,024) is raised to the hard limit,
    # which then bounds the front's connections (Capacity.for_batch).
    files = raise_open_file_limit()
    logging.getLogger(__name__).info("open-file limit %d (soft limit raised to the hard limit)", files)

    runner = open_runner(config.artifact, **_runner_options(config))
    runner.activate()
    endpoint = None
    try:
        infer, endpoint = _inference(config, runner, contract, halt, max_batch)
    except BaseException:
        runner.close()
        raise
    # tritonserver's HTTP endpoint is private (loopback, a free port); the user's port is the front's,
    # which checks every request against the model before Triton allocates anything (front.py).
    backend_http_port = _private_port()
    bounds = (("inputs", contract.vocab_size), ("puzzle_identifiers", contract.num_puzzle_identifiers))
    limits = Limits(config.model_name, contract.seq_len, max_batch, outputs=OUTPUTS, bounds=bounds)
    fronts: list[Front] = []
    stopped = threading.Event()  # set by SIGINT/SIGTERM once serving
    signalled, previous = _stop_on_signals(fronts, stopped)
    binding.quiet_logs()
    binding.request_errors_as_400()
    gate = binding.Gate(infer)  # Triton's inferences of ours (gRPC, dynamic batching), counted for the stop
    code = 0
    try:
        with contextlib.ExitStack() as stack:
            triton = stack.enter_context(
                pytriton_triton.Triton(
                    config=binding.triton_config(
                        backend_http_port=backend_http_port,
                        host=config.host,
                        grpc_port=config.grpc_port,
                        metrics_port=config.metrics_port,
                    )
                )
            )
            # runs after the front closed and before PyTriton's own stop (an exit stack unwinds in reverse)
            stack.callback(_stop_fast, triton, gate, signalled)
            binding.bind_model(
                triton,
                model_name=config.model_name,
                infer=gate,
                seq_len=contract.seq_len,
                vocab_size=contract.vocab_size,
                max_batch=max_batch,
                queue_delay_us=0 if endpoint else config.queue_delay_us,
            )
            triton.connect()  # starts tritonserver, loads the model, waits until it is ready
            fronts.append(
                stack.enter_context(Front(config.host, config.http_port, backend_http_port, limits, local=endpoint))
            )
            if endpoint is not None:  # runs before the front closes: answers go out first
                stack.callback(endpoint.drain, DRAIN_GRACE_S)
            if ready is not None:
                ready(_ready_line(config, runner.name, max_batch, inflight=endpoint is not None))
            while not stopped.wait(MONITOR_S):  # until a signal, or tritonserver dies under us
                if not triton.is_alive():
                    code = 1
                    break
    except KeyboardInterrupt:
        pass  # interrupted while starting: the context manager has stopped what was started
    finally:
        if endpoint is not None:
            endpoint.scheduler.stop(0)  # the loop is done with the runner before it closes
        runner.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


def _stop_on_signals(fronts: list[Front], stopped: threading.Event) -> tuple[list[int], dict[int, Any]]:
    """SIGTERM/SIGINT: the fronts stop taking requests, then serving ends (``stopped``; while starting,
    as Ctrl-C: a KeyboardInterrupt, and what started is stopped); (the signals seen, the handlers
    replaced). Only the main thread can install handlers; elsewhere (tests) nothing changes."""
    signalled: list[int] = []
    previous: dict[int, Any] = {}

    def on_signal(signum: int, frame: Any) -> None:
        signalled.append(signum)
        for front in fronts:  # no new request is taken while Triton stops
            front.stop_accepting()
        if not fronts:  # still starting
            raise KeyboardInterrupt(f"signal {signum}")
        stopped.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, on_signal)
    return signalled, previous


def _stop_fast(triton: Any, gate: Any, signalled: list[int]) -> None:
    """A stop that was asked for: once Triton runs no inference of ours (the front has answered what it
    took, the gate refuses new gRPC requests and waits for the running ones), tritonserver and its
    backend stubs are ended at once; its own graceful stop unloads the model first and takes seconds."""
    from hrm_deploy.serve import binding

    if signalled and gate.close(DRAIN_GRACE_S):
        binding.kill_server(triton)


def _ready_line(config: ServeConfig, runner_name: str, max_batch: int, *, inflight: bool) -> str:
    mode = f"in-flight batching, {max_batch} slots" if inflight else f"dynamic batching, max batch {max_batch}"
    return (
        f"serving {config.artifact.name} as model '{config.model_name}' ({runner_name}, {mode}) on "
        f"http://{config.host}:{config.http_port} grpc {config.host}:{config.grpc_port} "
        f"metrics :{config.metrics_port}"
    )


def main_ready_line(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
