"""A fake ``tensorrt`` module for tests and benchmarks, never for a claim that an engine ran: it
records every call, for driving the TensorRT adapter and the device loop on the CPU with
:class:`~hrm_deploy.runtime.memory.HostMemory` (the tests check our side of TensorRT's protocol with
it; ``benchmarks/loop_overhead.py`` times the loop's own Python cost with it). Nothing in the package
imports it.

An "engine" is a JSON spec (what ``deserialize_cuda_engine`` gets): its mode (step or
unrolled), sizes, tensor dtypes (TensorRT DataType names) and batch profile. Executing
reads and writes the bound host buffers by address, enqueued on the HostMemory stream the
way TensorRT enqueues on a CUDA stream (so capture records it and replay re-runs it, with
the addresses bound at enqueue time). The maths is a small deterministic recurrence with
the shapes of an HRM step; :func:`reference` computes the same thing directly.
"""

from __future__ import annotations

import enum
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from hrm_deploy.contract import CARRY, CARRY_OUT
from hrm_deploy.runtime.memory import HostMemory

__version__ = "10.3.0.30"
CALLS: Counter[str] = Counter()


class Builder:  # load_backend checks that the module is real (not stubs) by this attribute
    pass


class DataType(enum.Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    BF16 = 7
    INT64 = 8


class TensorIOMode(enum.Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class ExecutionContextAllocationStrategy(enum.Enum):
    STATIC = 0
    ON_PROFILE_CHANGE = 1
    USER_MANAGED = 2


class IProfiler:
    """TensorRT's per-layer profiler interface: ``report_layer_time(name, ms)`` per layer per execute."""

    def report_layer_time(self, layer_name: str, ms: float) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class Logger:
    WARNING = 2

    def __init__(self, level: int = 2):
        self.level = level


class ILogger:
    """TensorRT's logger interface: ``log(severity, msg)``, severities 0 (internal error) to 4 (verbose)."""

    class Severity(enum.IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    def log(self, severity: ILogger.Severity, msg: str) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


STORAGE = {
    "FLOAT": np.float32,
    "HALF": np.float16,
    "INT32": np.int32,
    "INT64": np.int64,
    "BOOL": np.bool_,
    "BF16": np.uint16,
}


def spec(
    mode: str = "step",
    batch: tuple[int, int] = (1, 16),
    steps: int = 4,
    seq: int = 6,
    vocab: int = 5,
    hidden: int = 8,
    dtypes: dict[str, str] | None = None,
    step_predictions: bool = True,
    noop: bool = False,
    rows_dim: int = 0,
    layers: dict[str, float] | None = None,
) -> dict[str, Any]:
    return {
        "mode": mode,
        "batch": list(batch),
        "steps": steps,
        "S": seq,
        "V": vocab,
        "T": seq + 1,
        "D": hidden,
        "dtypes": dtypes or {},
        "step_predictions": step_predictions,
        "noop": noop,
        "rows_dim": rows_dim,  # > 0: the engine of an external-table export (takes puzzle_emb_rows)
        "layers": layers or {},  # {layer name: ms} an attached IProfiler hears per execute
    }


def engine_bytes(**kwargs: Any) -> bytes:
    return json.dumps(spec(**kwargs)).encode()


def write_engine(path: Path, precision: str = "fp32", **kwargs: Any) -> dict[str, Any]:
    """Write a fake engine of ``spec(**kwargs)`` to ``path`` with the manifest a build writes;
    returns the spec."""
    from hrm_deploy.manifest import write_manifest

    s = spec(**kwargs)
    path.write_bytes(engine_bytes(**kwargs))
    write_manifest(
        path,
        stage="engine",
        config={},
        backend={"name": "tensorrt", "version": __version__},
        precision=precision,
        mode=s["mode"],
        steps=s["steps"],
        compute_capability=None,
        build_machine={},
    )
    return s


def write_stripped_engine(path: Path, graph: Path, **kwargs: Any) -> dict[str, Any]:
    """A fake weight-stripped engine built from ``graph`` (``build-engine --strip-weights``): its weights
    are the graph's sha256, missing until refit; the manifest names the graph to refit from."""
    import hashlib
    import os

    from hrm_deploy.manifest import write_manifest

    digest = hashlib.sha256(graph.read_bytes()).hexdigest()
    s = {**spec(**kwargs), "stripped": True, "weights": digest}
    path.write_bytes(json.dumps(s).encode())
    write_manifest(
        path,
        stage="engine",
        config={},
        backend={"name": "tensorrt", "version": __version__},
        precision="fp16",
        mode=s["mode"],
        steps=s["steps"],
        compute_capability=None,
        build_machine={},
        weights_stripped=True,
        refit_source={"path": os.path.relpath(graph, path.parent), "sha256": digest},
    )
    return s


def _io(s: dict[str, Any]) -> list[tuple[str, bool, tuple[int, ...]]]:
    S, V, T, D, n = s["S"], s["V"], s["T"], s["D"], s["steps"]
    feeds = [("inputs", True, (-1, S)), ("puzzle_identifiers", True, (-1,))]
    if s.get("rows_dim"):  # the gathered table rows; the maths reads column 0 as the identifier
        feeds[1] = ("puzzle_emb_rows", True, (-1, s["rows_dim"]))
    if s["mode"] == "step":
        return feeds + [
            *((name, True, (-1, T, D)) for name in CARRY),
            ("reset", True, (-1,)),
            *((name, False, (-1, T, D)) for name in CARRY_OUT),
            ("logits", False, (-1, S, V)),
            ("q_halt_logits", False, (-1,)),
            ("q_continue_logits", False, (-1,)),
        ]
    outs = [("logits", False, (-1, S, V)), ("q_halt_logits", False, (-1, n)), ("q_continue_logits", False, (-1, n))]
    if s["step_predictions"]:
        outs.append(("step_predictions", False, (-1, n, S)))
    return feeds + outs


DEFAULT_DTYPES = {"inputs": "INT32", "puzzle_identifiers": "INT32", "reset": "BOOL", "step_predictions": "INT32"}


def step_math(
    s: dict[str, Any], inputs: np.ndarray, ids: np.ndarray, z_H: np.ndarray, z_L: np.ndarray, reset: np.ndarray
) -> tuple[np.ndarray, ...]:
    """One fake ACT step in float32: (z_H', z_L', logits [B,S,V], q_halt [B], q_continue [B])."""
    S, V = s["S"], s["V"]
    mask = reset.reshape(-1, 1, 1)
    z_H = np.where(mask, np.float32(0.1), z_H).astype(np.float32)
    z_L = np.where(mask, np.float32(-0.1), z_L).astype(np.float32)
    drive = (inputs.astype(np.float32).mean(-1) / 3.0 + ids.astype(np.float32) * 0.25 - 0.5)[:, None, None]
    z_L = np.tanh(0.6 * z_L + 0.3 * z_H + drive).astype(np.float32)
    z_H = np.tanh(0.7 * z_H + 0.5 * z_L).astype(np.float32)
    logits = (z_H[:, :S, :V] + 0.05 * inputs[..., None].astype(np.float32) * np.arange(V, dtype=np.float32)).astype(
        np.float32
    )
    q_halt = (8.0 * z_H[:, 0, 0] + inputs[:, 0].astype(np.float32) - 2.0).astype(np.float32)
    return z_H, z_L, logits, q_halt, (-q_halt).astype(np.float32)


def reference(
    s: dict[str, Any], inputs: np.ndarray, ids: np.ndarray, steps: int | None = None
) -> dict[str, np.ndarray]:
    """What the engine computes, directly: final logits, per-step q logits, per-step argmax and logits."""
    steps = steps or s["steps"]
    batch = len(inputs)
    z = np.zeros((batch, s["T"], s["D"]), np.float32)
    z_H, z_L = z, z
    halts, conts, preds, all_logits = [], [], [], []
    for k in range(steps):
        z_H, z_L, logits, q_h, q_c = step_math(s, inputs, ids, z_H, z_L, np.full(batch, k == 0))
        halts.append(q_h)
        conts.append(q_c)
        preds.append(logits.argmax(-1).astype(np.int32))
        all_logits.append(logits)
    return {
        "logits": logits,
        "q_halt_logits": np.stack(halts, 1),
        "q_continue_logits": np.stack(conts, 1),
        "step_predictions": np.stack(preds, 1),
        "per_step_logits": np.stack(all_logits, 1),
    }


def _store(array: np.ndarray, kind: str) -> np.ndarray:
    if kind == "BF16":  # float32 -> bfloat16 bits (round to nearest even is not needed for a fake)
        return (array.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return array.astype(STORAGE[kind])


def _load(array: np.ndarray, kind: str) -> np.ndarray:
    if kind == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array


class ICudaEngine:
    def __init__(self, s: dict[str, Any]):
        self.spec = s
        self.io = _io(s)
        self.kinds = {name: s["dtypes"].get(name, DEFAULT_DTYPES.get(name, "FLOAT")) for name, _, _ in self.io}
        self.device_memory_size_v2 = 4096

    @property
    def num_io_tensors(self) -> int:
        return len(self.io)

    def get_tensor_name(self, i: int) -> str:
        return self.io[i][0]

    def _entry(self, name: str) -> tuple[str, bool, tuple[int, ...]]:
        return next(e for e in self.io if e[0] == name)

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return TensorIOMode.INPUT if self._entry(name)[1] else TensorIOMode.OUTPUT

    def get_tensor_dtype(self, name: str) -> DataType:
        return DataType[self.kinds[name]]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self._entry(name)[2]

    def get_tensor_profile_shape(self, name: str, profile: int) -> list[tuple[int, ...]]:
        low, high = self.spec["batch"]
        shape = self._entry(name)[2]
        return [tuple(b if d == -1 else d for d in shape) for b in (low, low, high)]

    def create_execution_context(self, strategy: Any = None) -> IExecutionContext:
        CALLS["create_execution_context"] += 1
        return IExecutionContext(self, strategy)

    def create_serialization_config(self) -> SerializationConfig:
        return SerializationConfig()

    def serialize_with_config(self, config: SerializationConfig) -> bytes:
        stripped = self.spec.get("stripped") or SerializationFlag.EXCLUDE_WEIGHTS in config.flags
        return json.dumps({**self.spec, "stripped": bool(stripped)}).encode()


class IExecutionContext:
    def __init__(self, engine: ICudaEngine, strategy: Any):
        self.engine, self.strategy = engine, strategy
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.device_memory: tuple[int, int] | None = None
        self.profiler: IProfiler | None = None  # reports the spec's "layers" {name: ms} per execute

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        CALLS["set_input_shape"] += 1
        low, high = self.engine.spec["batch"]
        want = self.engine.get_tensor_shape(name)
        ok = len(shape) == len(want) and low <= shape[0] <= high and all(w in (-1, d) for w, d in zip(want, shape))
        if ok:
            self.shapes[name] = tuple(shape)
        return ok

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        batch = self.shapes.get("inputs", (-1,))[0]
        return tuple(batch if d == -1 else d for d in self.engine.get_tensor_shape(name))

    def update_device_memory_size_for_shapes(self) -> int:
        return 1024 * max(1, self.shapes.get("inputs", (1,))[0])

    def set_device_memory(self, ptr: int, size: int) -> None:
        CALLS["set_device_memory"] += 1
        self.device_memory = (ptr, size)

    def set_tensor_address(self, name: str, ptr: int) -> bool:
        CALLS["set_tensor_address"] += 1
        self.addresses[name] = ptr
        return True

    def execute_async_v3(self, stream: int) -> bool:
        CALLS["execute_async_v3"] += 1
        memory = HostMemory.from_handle(stream)
        bound = dict(self.addresses)  # TensorRT uses the addresses set at enqueue time
        missing = [n for n, _, _ in self.engine.io if n not in bound]
        if missing or self.device_memory is None or self.engine.spec.get("stripped"):  # no weights: no run
            return False
        engine, profiler = self.engine, self.profiler

        def run() -> None:
            CALLS["executed"] += 1
            if profiler is not None:
                for layer, ms in engine.spec.get("layers", {}).items():
                    profiler.report_layer_time(layer, ms)
            if engine.spec.get("noop"):  # the loop-overhead benchmark: no maths, only the loop's own cost
                return
            get = {n: _load(memory.array_at(p), engine.kinds[n]) for n, p in bound.items()}
            if "puzzle_emb_rows" in get:
                get["puzzle_identifiers"] = get["puzzle_emb_rows"][:, 0]
            s = engine.spec
            if s["mode"] == "step":
                outs = step_math(
                    s,
                    get["inputs"],
                    get["puzzle_identifiers"],
                    get[CARRY[0]].astype(np.float32),
                    get[CARRY[1]].astype(np.float32),
                    get["reset"].astype(bool),
                )
                names: tuple[str, ...] = (*CARRY_OUT, "logits", "q_halt_logits", "q_continue_logits")
            else:
                ref = reference(s, get["inputs"], get["puzzle_identifiers"])
                names = ("logits", "q_halt_logits", "q_continue_logits") + (
                    ("step_predictions",) if s["step_predictions"] else ()
                )
                outs = tuple(ref[n] for n in names)
            for name, value in zip(names, outs):
                np.copyto(memory.array_at(bound[name]), _store(value, engine.kinds[name]))

        memory.enqueue(run)
        return True


class SerializationFlag(enum.Enum):
    EXCLUDE_WEIGHTS = 0
    EXCLUDE_LEAN_RUNTIME = 1


class SerializationConfig:
    def __init__(self) -> None:
        self.flags = {SerializationFlag.EXCLUDE_WEIGHTS}  # a stripped engine serializes without weights by default

    def clear_flag(self, flag: SerializationFlag) -> bool:
        self.flags.discard(flag)
        return True


class Refitter:
    """Refits a fake stripped engine: its spec's ``weights`` (the sha256 of the graph it was built from)
    are missing until a parser refitter reads bytes whose sha256 they are; ``FAKE_MISSING`` forces a
    weight to stay missing."""

    def __init__(self, engine: ICudaEngine, logger: Logger):
        self.engine = engine
        self.given: str | None = None  # sha256 of the weights refit from

    def get_missing_weights(self) -> list[str]:
        forced = list(self.engine.spec.get("forced_missing", []))
        return forced + ([] if self.given == self.engine.spec.get("weights") else ["step/onnx::MatMul_1084"])

    def refit_cuda_engine(self) -> bool:
        CALLS["refit_cuda_engine"] += 1
        if self.get_missing_weights():
            return False
        self.engine.spec["stripped"] = False
        return True


class OnnxParserRefitter:
    num_errors = 0

    def __init__(self, refitter: Refitter, logger: Logger):
        self.refitter = refitter

    def refit_from_bytes(self, model: bytes, path: str | None = None) -> bool:
        import hashlib

        CALLS["refit_from_bytes"] += 1
        self.refitter.given = hashlib.sha256(bytes(model)).hexdigest()
        return True


class Runtime:
    def __init__(self, logger: Logger):
        self.logger = logger

    def deserialize_cuda_engine(self, data: bytes) -> ICudaEngine | None:
        try:
            return ICudaEngine(json.loads(data))
        except ValueError:
            if hasattr(self.logger, "log"):  # as TensorRT says why, through the runtime's logger
                self.logger.log(
                    ILogger.Severity.ERROR, "IRuntime::deserializeCudaEngine: Error Code 1: magic tag mismatch"
                )
            return None
