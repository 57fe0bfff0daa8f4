"""PyTriton, and only PyTriton: the tensors bound into Triton, its configuration, and the one patch.

``hrm-deploy serve`` runs our runner inside PyTriton's bundled tritonserver. Everything that knows
PyTriton's API or its source text lives here, so :mod:`hrm_deploy.serve.server` is orchestration
only and a PyTriton upgrade has one place to review:

- :func:`bind_model` binds the inference function with the model's tensors and batcher;
- :func:`triton_config` is tritonserver's configuration (its HTTP endpoint private, behind the front);
- :func:`request_errors_as_400` patches PyTriton's proxy model so that a refused request is HTTP 400
  with its one line instead of HTTP 500 with a traceback. The patch is a text replacement in the
  proxy's ``model.py``; it applies only where that text is found verbatim (else one warning and
  errors stay HTTP 500), and ``tests/serve/test_binding.py`` fails when the installed PyTriton's
  text or version changes, so an upgrade is reviewed, not discovered in production.

Nothing here imports pytriton at module level.
"""

from __future__ import annotations

import contextlib
import logging
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

DISTRIBUTION = "nvidia-pytriton"
# The PyTriton releases whose proxy model.py the patch below was written against and tested with.
TESTED_VERSIONS = ("0.7.0",)

# PyTriton's proxy model (copied into the model store, run by Triton's Python backend) turns any
# error of the inference function into an internal error (HTTP 500, the stub's traceback). A bad
# request is the client's error: the copied model.py is patched so that an error raised as
# RequestError answers every request of the batch with INVALID_ARG (HTTP 400) and its one line.
PROXY_ERROR = """                    triton_responses_or_error = pb_utils.TritonModelException(  # pytype: disable=module-attr
                        responses_payload.decode("utf-8")
                    )
"""
PROXY_REQUEST_ERROR = """                    _text = responses_payload.decode("utf-8")
                    _marker = "RequestError: "
                    if _marker in _text:  # written by hrm-deploy serve: the client's error, one line
                        _line = _text.rsplit(_marker, 1)[1].strip().splitlines()[0]
                        triton_responses_or_error = [
                            pb_utils.InferenceResponse(  # pytype: disable=module-attr
                                error=pb_utils.TritonError(_line, pb_utils.TritonError.INVALID_ARG)
                            )
                            for _ in triton_requests
                        ]
                    else:
                        triton_responses_or_error = pb_utils.TritonModelException(  # pytype: disable=module-attr
                            _text
                        )
"""


def pytriton_version() -> str | None:
    """The installed PyTriton release, or None where it is not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None


def proxy_model_text() -> str:
    """The source of PyTriton's proxy ``model.py`` (what Triton's Python backend runs)."""
    from pytriton.models import model as pytriton_model

    return (Path(pytriton_model.__file__).parent.parent / "proxy" / "model.py").read_text()


def patched_proxy_text(text: str) -> str | None:
    """``text`` with the request-error patch applied, or None where the text to replace is absent."""
    return text.replace(PROXY_ERROR, PROXY_REQUEST_ERROR) if PROXY_ERROR in text else None


class OneLineRequestErrors(logging.Filter):
    """PyTriton logs every error of the inference function with its traceback; a refused request
    is the client's error, logged as its one line (other errors keep their traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "RequestError: " in text:
            line = text.rsplit("RequestError: ", 1)[1].strip().splitlines()[0]
            record.msg, record.args, record.exc_info = "refused a request: %s", (line,), None
        return True


def request_errors_as_400() -> bool:
    """Make PyTriton's proxy model answer a ``RequestError`` with HTTP 400 (see the module text);
    False (with a warning; errors stay HTTP 500 with the same message) where its model.py differs."""
    from pytriton.models import model as pytriton_model

    original = pytriton_model.Model.generate_model
    if getattr(original, "_request_errors_as_400", False):
        return True
    version = pytriton_version()
    if version not in TESTED_VERSIONS:
        logger.info("PyTriton %s is not a release hrm-deploy was tested with (%s)", version, ", ".join(TESTED_VERSIONS))
    if patched_proxy_text(proxy_model_text()) is None:
        logger.warning(
            "this PyTriton's (%s) proxy model differs from the one hrm-deploy knows: bad requests get HTTP 500", version
        )
        return False

    original_files = pytriton_model.Model.get_proxy_model_files

    def generate_model(self: Any, model_repository: Path) -> None:  # a local model store
        original(self, model_repository)
        copied = Path(model_repository) / self.model_name / str(self.model_version) / "model.py"
        copied.write_text(copied.read_text().replace(PROXY_ERROR, PROXY_REQUEST_ERROR))

    def get_proxy_model_files(self: Any) -> dict[str, bytes]:  # files sent with the load request
        files = original_files(self)
        key = f"file:{self.model_version}/model.py"
        if key in files:
            files[key] = files[key].decode().replace(PROXY_ERROR, PROXY_REQUEST_ERROR).encode()
        return files

    generate_model._request_errors_as_400 = True  # type: ignore[attr-defined]
    pytriton_model.Model.generate_model = generate_model  # type: ignore[method-assign]
    pytriton_model.Model.get_proxy_model_files = get_proxy_model_files  # type: ignore[method-assign]
    return True


def quiet_logs() -> None:
    """PyTriton's own logs at WARNING, and refused requests as one line (not a traceback)."""
    logging.getLogger("pytriton").setLevel(logging.WARNING)
    logging.getLogger("pytriton.proxy.inference").addFilter(OneLineRequestErrors())


def triton_config(
    *, backend_http_port: int, host: str, grpc_port: int, metrics_port: int, exit_timeout_secs: int = 5
) -> Any:
    """tritonserver's configuration: its HTTP endpoint private (loopback, behind the checking
    front), gRPC and metrics on the user's host and ports, no GPU metrics."""
    from pytriton.triton import TritonConfig

    return TritonConfig(
        http_address="127.0.0.1",
        http_port=backend_http_port,
        grpc_address=host,
        grpc_port=grpc_port,
        metrics_address=host,
        metrics_port=metrics_port,
        allow_gpu_metrics=False,
        exit_timeout_secs=exit_timeout_secs,
    )


def model_tensors(seq_len: int, vocab_size: int) -> dict[str, Any]:
    """The per-request tensors (batch axis added by Triton): see :mod:`hrm_deploy.serve.server`."""
    from pytriton.model_config import Tensor

    return {
        "inputs": [
            Tensor(name="inputs", dtype=np.int32, shape=(seq_len,)),
            Tensor(name="puzzle_identifiers", dtype=np.int32, shape=(1,)),
        ],
        "outputs": [
            Tensor(name="answer", dtype=np.int32, shape=(seq_len,)),
            Tensor(name="logits", dtype=np.float32, shape=(seq_len, vocab_size)),
            Tensor(name="q_halt_logits", dtype=np.float32, shape=(-1,)),
            Tensor(name="steps", dtype=np.int32, shape=(1,)),
            Tensor(name="act_steps", dtype=np.int32, shape=(1,)),
        ],
    }


def bind_model(
    triton: Any, *, model_name: str, infer: Any, seq_len: int, vocab_size: int, max_batch: int, queue_delay_us: int
) -> None:
    """Bind ``infer`` into ``triton`` as ``model_name`` behind Triton's dynamic batcher (a delay of 0:
    every request goes on at once, as the in-flight loop wants)."""
    from pytriton.model_config import DynamicBatcher, ModelConfig

    triton.bind(
        model_name=model_name,
        infer_func=infer,
        **model_tensors(seq_len, vocab_size),
        config=ModelConfig(
            max_batch_size=max_batch, batcher=DynamicBatcher(max_queue_delay_microseconds=queue_delay_us)
        ),
        strict=True,
    )


def bundled_tritonserver(
    repo: Path, workdir: Path, *, http_port: int, grpc_port: int, metrics_port: int, host: str = "127.0.0.1"
) -> tuple[list[str], dict[str, str]]:
    """(command line, environment) that run PyTriton's bundled ``tritonserver`` on the model repository
    ``repo`` as a stock Triton is run (``tritonserver --model-repository REPO``), without PyTriton:
    its Python backend (and the stub for this Python) in ``workdir/backends``, its libraries on
    ``LD_LIBRARY_PATH``, this interpreter's folder first on ``PATH`` for the stub.
    Used to test and measure ``triton-repo`` repositories on the server PyTriton ships."""
    import os
    import shutil
    import sys

    import pytriton

    site = Path(pytriton.__file__).resolve().parents[1]
    dist = site / "pytriton" / "tritonserver"
    backend = workdir / "backends" / "python"
    backend.mkdir(parents=True, exist_ok=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        if not (backend / name).exists():
            (backend / name).symlink_to(dist / "backends" / "python" / name)
    stub = dist / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}" / "triton_python_backend_stub"
    if not (backend / stub.name).exists():
        shutil.copy(stub, backend / stub.name)  # the backend runs the stub it finds beside itself
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [str(site / "nvidia_pytriton.libs"), env.get("LD_LIBRARY_PATH")]))
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    command = [str(dist / "bin" / "tritonserver"), "--model-repository", str(repo)]
    command += ["--backend-directory", str(workdir / "backends"), "--allow-gpu-metrics", "false"]
    for flag, port in (("http", http_port), ("grpc", grpc_port), ("metrics", metrics_port)):
        command += [f"--{flag}-address", host, f"--{flag}-port", str(port)]
    return command, env


class Gate:
    """The function bound into Triton, with a door: :meth:`close` refuses new requests (one line: the
    server is stopping) and waits for the running ones, so a stopping ``serve`` knows when Triton holds
    no inference of ours any more (gRPC clients reach Triton directly, not through the front)."""

    def __init__(self, infer: Any):
        import threading

        self.infer, self.active, self.closed = infer, 0, False
        self._cond = threading.Condition()

    def __call__(self, requests: list[Any]) -> Any:
        from hrm_deploy.serve.wire import RequestError

        with self._cond:
            if self.closed:
                raise RequestError("the server is stopping; send the request to another instance")
            self.active += 1
        try:
            return self.infer(requests)
        finally:
            with self._cond:
                self.active -= 1
                self._cond.notify_all()

    def close(self, timeout_s: float) -> bool:
        """Refuse new requests; True once none is running (False: ``timeout_s`` passed first)."""
        with self._cond:
            self.closed = True
            return self._cond.wait_for(lambda: self.active == 0, timeout=timeout_s)


class _StoppedOnPurpose(logging.Filter):
    """PyTriton's warning that tritonserver 'exited with failure', after :func:`kill_server` ended it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "exited with failure" not in record.getMessage()


def kill_server(triton: Any) -> bool:
    """End tritonserver and its backend stubs at once (SIGKILL); False where this PyTriton does not say
    which process it runs (then its own stop, which unloads the model first, takes a few seconds).

    Only for a server that holds nothing of ours: the front answered what it took and the bound
    function's :class:`Gate` is closed with nothing running. PyTriton's stop then finds the process gone
    and cleans its workspace (reviewed against PyTriton 0.7.0: ``Triton._triton_server`` holds the
    ``sh`` command whose ``pid`` is tritonserver's)."""
    import os
    import signal

    command = getattr(getattr(triton, "_triton_server", None), "_tritonserver_running_cmd", None)
    pid = getattr(command, "pid", None)
    if command is None or not isinstance(pid, int):
        return False
    logging.getLogger("pytriton.server.triton_server").addFilter(_StoppedOnPurpose())
    for victim in [pid, *_descendants(pid)]:  # the stubs first would notice their parent's death later
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    with contextlib.suppress(Exception):  # sh raises for the signal it was killed by: expected here
        command.wait(timeout=10)
    return True


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (from /proc; [] where there is none)."""
    from pathlib import Path

    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found
