"""ONNX Runtime sessions, made in one place, and the host loop that drives a single-step graph.

Every session of the toolkit comes from :func:`ort_session`: export parity, INT8 calibration,
the ``ort`` runner, the ``cpu`` target's offline optimization and the doctor's provider probe.
It resolves the execution provider (our short names or ORT's own), keeps the CPU provider for
the nodes a GPU provider cannot take, and refuses a session that ORT silently moved to another
provider (a GPU provider that cannot load falls back to CPU, and a benchmark of that would be a
lie). :func:`step_once` is the one ONNX Runtime call of a single-step graph (one ACT segment,
carry in and out): :func:`run_stepwise` (export parity, tests), calibration's pass over the data
(:mod:`hrm_deploy.precision.calibrate`) and the ``ort`` backend's step function
(:mod:`hrm_deploy.backends.ort.step`, which the runner and the halting scheduler drive) all go
through it.

A base module: export (parity) and precision (calibration) must not import the runners, and all
of them use it. onnxruntime is imported only when a session is made.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from hrm_deploy.contract import CARRY, Q_LOGITS, RESET, STEP_OUTPUTS, STEP_PREDICTIONS
from hrm_deploy.errors import ConfigError, DependencyError, require

# our short provider names -> ONNX Runtime's
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}
CPU = PROVIDERS["cpu"]


class Optimization(str, Enum):
    """ONNX Runtime's graph optimization level (``GraphOptimizationLevel``); ``all`` is ORT's default."""

    DISABLED = "disabled"
    BASIC = "basic"
    EXTENDED = "extended"
    ALL = "all"


_ORT_LEVELS = {
    Optimization.DISABLED: "ORT_DISABLE_ALL",
    Optimization.BASIC: "ORT_ENABLE_BASIC",
    Optimization.EXTENDED: "ORT_ENABLE_EXTENDED",
    Optimization.ALL: "ORT_ENABLE_ALL",
}


@dataclass(frozen=True)
class SessionTuning:
    """ORT session settings that change speed, never answers (see :func:`ort_session`):
    busy-waiting intra-op threads, the CPU memory arena and planned allocation."""

    spinning: bool = True
    arena: bool = True
    memory_pattern: bool = True


class LogSeverity(IntEnum):
    """ONNX Runtime's log severities (``SessionOptions.log_severity_level``)."""

    VERBOSE = 0
    INFO = 1
    WARNING = 2
    ERROR = 3  # our default: ORT's warnings (unused initializers, ...) are noise to our users
    FATAL = 4


def provider_name(provider: str) -> str:
    """ORT's name for ``provider``: one of our short names (``cpu``, ``cuda``, ``tensorrt``) or
    ORT's own ``...ExecutionProvider`` name, taken as is; anything else is a :class:`ConfigError`."""
    if provider in PROVIDERS:
        return PROVIDERS[provider]
    if provider.endswith("ExecutionProvider"):
        return provider
    raise ConfigError(f"ORT provider {provider!r} unknown; use one of {', '.join(PROVIDERS)}")


# One protobuf message (an ONNX file without external data) cannot exceed 2 GiB; larger
# weights live in external ``.data`` files, so a bigger ``.onnx`` is not an ONNX graph.
MAX_ONNX_BYTES = 2**31


def check_onnx_file(path: str | Path) -> int:
    """The size of ``path`` after checking, without opening it, that it can be an ONNX file: a
    regular file (a FIFO would block a reader forever, ``/dev/zero`` never ends), not empty and
    under :data:`MAX_ONNX_BYTES`. Raises one :class:`~hrm_deploy.errors.ArtifactError` line."""
    import os
    import stat

    from hrm_deploy.errors import ArtifactError

    try:
        st = os.stat(path)
    except OSError as exc:
        raise ArtifactError(f"{path} cannot be read ({exc.strerror}); give an ONNX file") from None
    if not stat.S_ISREG(st.st_mode):
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, socket or device)"
        raise ArtifactError(f"{path} is {what}, not an ONNX file; give the .onnx file itself")
    if st.st_size == 0:
        raise ArtifactError(f"{path} is empty, not a readable ONNX file; re-export it")
    if st.st_size >= MAX_ONNX_BYTES:
        raise ArtifactError(
            f"{path} is {st.st_size / 2**30:.1f} GiB, over protobuf's 2 GiB limit for an ONNX file "
            "(larger weights live in external data): not a readable ONNX file; re-export it"
        )
    return st.st_size


def load_onnx(path: str | Path, weights: bool = False) -> Any:
    """An ``onnx.ModelProto`` of ``path`` (weights in external data loaded only with ``weights``),
    size-checked before it is read (:func:`check_onnx_file`); anything that does not parse as an
    ONNX model (truncated, random bytes) is one :class:`~hrm_deploy.errors.ArtifactError` line: the
    one loader every stage reads a graph with."""
    check_onnx_file(path)
    onnx = require("onnx", "onnx", "Reading ONNX files")
    try:
        model = onnx.load(str(path), load_external_data=weights)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several unrelated types (DecodeError, ...)
        raise _unreadable(path, type(exc).__name__) from None
    if model.ir_version <= 0 or not model.graph.node:
        raise _unreadable(path, "no ONNX graph in it")
    return model


def load_onnx_bytes(data: bytes, path: str | Path) -> Any:
    """:func:`load_onnx` of bytes already read from ``path`` (e.g. the ones whose sha256 was checked)."""
    onnx = require("onnx", "onnx", "Reading ONNX files")
    try:
        model = onnx.load_model_from_string(data)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several unrelated types (DecodeError, ...)
        raise _unreadable(path, type(exc).__name__) from None
    if model.ir_version <= 0 or not model.graph.node:
        raise _unreadable(path, "no ONNX graph in it")
    return model


def _unreadable(path: str | Path, why: str) -> Exception:
    from hrm_deploy.errors import ArtifactError

    return ArtifactError(f"{path} is not a readable ONNX file ({why}); it is truncated or damaged: re-export it")


def holds_fp4(model: Any) -> bool:
    """Whether an ONNX ``model`` holds FP4 (FLOAT4E2M1) tensors or TensorRT's FP4 dynamic
    quantization: an NVFP4 graph, which ONNX Runtime has no kernels for."""
    from onnx import TensorProto

    return any(n.op_type == "TRT_FP4DynamicQuantize" for n in model.graph.node) or any(
        i.data_type == TensorProto.FLOAT4E2M1 for i in model.graph.initializer
    )


def _write_fault(path: Path) -> Exception:
    """The machine fault behind a failed write of ``path`` (ORT reports only "serialization failed"):
    a read-only or foreign folder (raised by :func:`hrm_deploy.io.check_writable`), a full disk, or
    else one line that still blames the write, never the input graph."""
    import errno
    import shutil

    from hrm_deploy.errors import ArtifactError, machine_fault
    from hrm_deploy.io import check_writable

    check_writable(path)
    folder = path.parent if path.parent.exists() else Path(".")
    if shutil.disk_usage(folder).free < (1 << 20) + (path.stat().st_size if path.exists() else 0):
        return machine_fault(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))) or OSError(errno.ENOSPC)
    return ArtifactError(f"{path}: ONNX Runtime could not write the optimized graph; check the folder and its disk")


def ort_session(
    model: str | Path | bytes,
    *,
    provider: str = "cpu",
    threads: int | None = None,
    optimization: Optimization = Optimization.ALL,
    optimized_model_path: str | Path | None = None,
    log_severity: LogSeverity = LogSeverity.ERROR,
    allow_fallback: bool = False,
    spinning: bool = True,
    priority_order: bool = False,
    profile_prefix: str | Path | None = None,
    arena: bool = True,
    memory_pattern: bool = True,
) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``model`` (a path or the serialized graph).

    ``provider`` (see :func:`provider_name`) runs the graph; a GPU provider gets the CPU
    provider after it for the nodes it cannot take. When ORT puts the graph on another provider
    first, that is a :class:`DependencyError`, unless ``allow_fallback`` (the doctor's probe,
    which reports it). ``threads`` sets the intra-op threads (None or 0: ORT's default, one per
    core). ``optimized_model_path`` makes ORT save the graph after its ``optimization`` passes
    there (the ``cpu`` target's offline optimization). ``spinning=False`` stops the intra-op
    threads busy-waiting between runs: for callers that alternate ORT with other CPU work (parity
    alternates with PyTorch, whose OpenMP threads the spinning starves). ``priority_order`` runs
    each node as soon as it can (``ExecutionOrder.PRIORITY_BASED``): reductions added to a graph
    then free the activations they read early (INT8 range collection). ``profile_prefix`` turns
    on ORT's session profiler (per-node JSON at ``<prefix>_<date>.json``, written by
    ``session.end_profiling()``). ``arena`` (ORT's CPU memory arena) and ``memory_pattern``
    (ORT's planned allocation for repeated shapes) are ORT's defaults; they are switches for
    measuring their effect.
    """
    wanted = provider_name(provider)
    ort = require("onnxruntime", "onnx", "Running ONNX graphs")
    options = ort.SessionOptions()
    options.log_severity_level = int(log_severity)
    if threads:
        options.intra_op_num_threads = threads
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _ORT_LEVELS[Optimization(optimization)])
    if optimized_model_path is not None:
        options.optimized_model_filepath = str(optimized_model_path)
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if priority_order:
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_prefix)
    options.enable_cpu_mem_arena = arena
    options.enable_mem_pattern = memory_pattern
    providers = [wanted] + ([CPU] if wanted != CPU else [])
    if not isinstance(model, bytes):
        check_onnx_file(model)  # never block on a FIFO or read /dev/zero forever
    try:
        session = ort.InferenceSession(model if isinstance(model, bytes) else str(model), options, providers=providers)
    except _load_errors(ort) as exc:
        raise load_failure(model, exc, optimized_model_path) from None
    used = session.get_providers()[0]
    if used != wanted and not allow_fallback:
        raise DependencyError(
            f"ONNX Runtime fell back to {used} instead of {wanted} (available here: "
            f"{', '.join(ort.get_available_providers())}); install onnxruntime-gpu with a "
            "matching CUDA/TensorRT, or use --provider cpu"
        )
    return session


# The file the graphs being loaded were made from (a build's source), named when ONNX Runtime refuses
# one of them (they are loaded from bytes: calibration's, a fusion's probe)
_SOURCE: contextvars.ContextVar[str | None] = contextvars.ContextVar("graph_source", default=None)


@contextlib.contextmanager
def made_from(source: str | Path) -> Iterator[None]:
    """Within it, a graph that ONNX Runtime refuses to load from bytes is named as made from ``source``."""
    token = _SOURCE.set(str(source))
    try:
        yield
    finally:
        _SOURCE.reset(token)


def _load_errors(ort: Any) -> tuple[type[BaseException], ...]:
    """The exceptions ONNX Runtime raises for a graph it cannot load (its pybind11 status classes)."""
    state = ort.capi.onnxruntime_pybind11_state
    names = (
        *("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException", "InvalidProtobuf"),
        *("ModelLoaded", "NotImplemented", "InvalidGraph", "EPFail", "NotFound", "ModelRequiresCompilation"),
    )
    return tuple(getattr(state, name) for name in names if isinstance(getattr(state, name, None), type))


_STATUS = re.compile(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*(\w+)\s*:\s*")
_LOAD_FROM = re.compile(r"^Load model from .*? failed:\s*")


def load_reason(exc: BaseException) -> str:
    """ONNX Runtime's reason, in one line: its first line without the status prefix and the path
    (the caller names the file), at most 300 characters."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    text = _LOAD_FROM.sub("", _STATUS.sub("", text)).strip().rstrip(".") or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def load_failure(model: str | Path | bytes, exc: BaseException, written: str | Path | None = None) -> Exception:
    """The one line for a graph ONNX Runtime refused to load (the loader's reason and what to do),
    whichever command opened it: every session is made by :func:`ort_session`. A failure to *write*
    the optimized graph (``written``) is the machine's, never the graph's."""
    from hrm_deploy.errors import ArtifactError

    status = _STATUS.match(str(exc).strip())
    code = status.group(1) if status else type(exc).__name__.upper()
    if written is not None and "serialization failed" in str(exc):
        return _write_fault(Path(written))  # disk full, read-only...: never blame the input
    where = str(model) if not isinstance(model, bytes) else f"the graph made from {_SOURCE.get() or 'it'}"
    if code in ("INVALID_PROTOBUF", "INVALIDPROTOBUF"):
        return ArtifactError(f"{where} is not a readable ONNX file (ONNX Runtime cannot parse it); re-export it")
    if code in ("NO_SUCHFILE", "NOSUCHFILE"):
        return ArtifactError(f"{where} does not exist (ONNX Runtime could not open it); give the graph's path")
    if code in ("EP_FAIL", "EPFAIL"):
        return DependencyError(
            f"ONNX Runtime's execution provider could not take {where}: {load_reason(exc)}; use --provider cpu, "
            "or install the onnxruntime and drivers the provider needs"
        )
    import onnxruntime

    fix = (
        "it needs kernels this ONNX Runtime lacks: run it where it was built for (a bf16 or fp8 graph on its GPU "
        "engine: build-engine), or use the FP32 export"
        if code in ("NOT_IMPLEMENTED", "NOTIMPLEMENTED")
        else "it is damaged or was not written by hrm-deploy: re-export it (hrm-deploy export) or rebuild it"
    )
    return ArtifactError(f"ONNX Runtime {onnxruntime.__version__} cannot load {where}: {load_reason(exc)}; {fix}")


@contextlib.contextmanager
def quiet_ort() -> Iterator[None]:
    """ORT's quantizer prints calibration chatter and root-logger warnings; keep them out of our output.
    Its module-level ``logging.info(...)`` calls also give the root logger a handler on first use
    (``logging.basicConfig``), which would print every later record of ours a second time
    (``INFO:hrm_deploy...``): handlers added to the root here are removed on the way out."""
    root = logging.getLogger()
    handlers = list(root.handlers)
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(logging.NOTSET)
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)


class CarryShape(Protocol):
    """What :func:`run_stepwise` reads of a model config (``HRMConfig`` has both)."""

    @property
    def total_seq_len(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...


def zero_carry(session, batch: int, config: CarryShape | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The initial carry (z_H, z_L) float32 [B, T, D] of a single-step graph: its shape from
    ``config``, or from the graph's ``z_H`` input when None."""
    if config is not None:
        shape = (batch, config.total_seq_len, config.hidden_size)
    else:
        dims = next(i.shape for i in session.get_inputs() if i.name == CARRY[0])
        shape = (batch, int(dims[1]), int(dims[2]))
    return np.zeros(shape, np.float32), np.zeros(shape, np.float32)


def step_once(
    session, feeds: dict[str, np.ndarray], carry: tuple[Any, Any], reset: np.ndarray, fetch: Sequence[str] = ()
) -> tuple[tuple[np.ndarray, np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """One ACT segment of a single-step graph: ``feeds`` (the graph's other inputs), ``carry``
    (z_H, z_L) and ``reset`` bool [B] (rows that start afresh) -> (next carry, [logits [B,S,V],
    q_halt [B], q_continue [B]], the ``fetch`` outputs (extra graph outputs) in order)."""
    z_H, z_L, *outputs = session.run(
        [*STEP_OUTPUTS, *fetch], {**feeds, CARRY[0]: carry[0], CARRY[1]: carry[1], RESET: reset}
    )
    heads = len(STEP_OUTPUTS) - len(CARRY)
    return (z_H, z_L), outputs[:heads], outputs[heads:]


def run_stepwise(
    session, feeds: dict[str, np.ndarray], config: CarryShape | None, steps: int, states: list | None = None
) -> dict[str, np.ndarray]:
    """Drive a single-step graph through ``steps`` segments (the host loop of a stepwise runtime).
    The carry's shape comes from ``config``, or from the graph's ``z_H`` input when None.
    Also returns each step's argmax as ``step_predictions`` [B, steps, S] (int32); each step's
    carry out ``(z_H, z_L)`` is appended to ``states`` when given (teacher-forced parity)."""
    batch = feeds["inputs"].shape[0]
    carry = zero_carry(session, batch, config)
    halts, continues, predictions = [], [], []
    for i in range(steps):
        carry, (logits, q_halt, q_continue), _ = step_once(session, feeds, carry, np.full((batch,), i == 0, bool))
        halts.append(q_halt)
        continues.append(q_continue)
        predictions.append(logits.argmax(-1).astype(np.int32))
        if states is not None:
            states.append(carry)
    q_halt_name, q_continue_name = Q_LOGITS
    return {
        "logits": logits,
        q_halt_name: np.stack(halts, 1),
        q_continue_name: np.stack(continues, 1),
        STEP_PREDICTIONS: np.stack(predictions, 1),
    }
