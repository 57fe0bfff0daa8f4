"""``hrm-deploy triton-repo``: a Triton Inference Server model repository from our artifacts.

Layout (one model per artifact; step artifacts get a driver model in front)::

    REPO/<name>/config.pbtxt
    REPO/<name>/1/model.plan | model.onnx (| model.py for Python-backend models)
    REPO/<name>/<artifact>.manifest.json         the artifact's manifest, beside the versions
    REPO/<name>_step/...                         step graphs/engines: the single-step model
    REPO/<name>/1/model.py                       ...and <name> is the ACT driver (Python backend, BLS)

Unrolled and loop artifacts are served directly (all ACT steps inside the graph); step artifacts get
the ACT driver so a request is still puzzles in, answers out. The driver is **in-flight** where a
halting rule is set (Triton's iterative sequences: one ACT step per ``execute``, requests that halted
answered, the others rescheduled, so a batch never waits for its slowest puzzle; one puzzle per
request; Triton 2.41 / 23.12 and later), or runs each dynamic batch to its end (``--batching dynamic``,
``--halt off``, or an older Triton named with ``--triton-version``). See
:mod:`hrm_deploy.serve.triton_models.act_driver`.
Every ``config.pbtxt`` is written in protobuf text format and re-parsed with tritonclient's
``model_config_pb2`` when tritonclient is installed.
"""

from __future__ import annotations

import enum
import json
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hrm_deploy.contract import CARRY, STEP_INPUTS, STEP_OUTPUTS
from hrm_deploy.errors import ArtifactError, ConfigError, InternalError
from hrm_deploy.io import staging_dir
from hrm_deploy.runtime.artifact import Contract, read_contract

# ONNX tensor type names (manifest "io") -> Triton config data types
TRITON_TYPES = {
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FLOAT": "TYPE_FP32",
    "FLOAT16": "TYPE_FP16",
    "BFLOAT16": "TYPE_BF16",
    "BOOL": "TYPE_BOOL",
}


DEFAULT_QUEUE_DELAY_US = 2000
MODEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,99}$")  # Triton model folder names we write
REPO_MARKER = ".hrm-deploy-repo.json"  # written in every repository: what --overwrite may replace
HALT_RULE = re.compile(r"^(off|q|threshold:0?\.\d*[1-9]\d*)$")  # threshold:X with 0 < X < 1


class OnnxBackend(str, enum.Enum):
    """How an ONNX graph is run in the repository."""

    onnxruntime = "onnxruntime"  # Triton's onnxruntime backend (the usual choice)
    python = "python"  # ONNX Runtime inside the Python backend (Triton builds without onnxruntime)


class RepoBatching(str, enum.Enum):
    """How the ACT driver of a step model shares the step model between requests."""

    auto = "auto"  # in-flight where a halting rule is set, dynamic otherwise
    inflight = "inflight"  # one ACT step per execute, unfinished requests rescheduled (iterative sequences)
    dynamic = "dynamic"  # Triton's dynamic batcher; each batch runs to its slowest puzzle


# The first Triton release whose Python backend can reschedule a request and whose sequence batcher
# reads ``iterative_sequence`` (23.11 shipped rescheduling under the earlier name ``generative_sequence``).
MIN_INFLIGHT_TRITON = (2, 41)
# Triton's reaper ends a sequence that has not enqueued a request for this long, and a request
# rescheduled after that fails ("must specify the START flag"). Its default of 1 s is shorter than a
# slow step (a large model on a busy CPU) or a wait in the backlog behind a full batch; a sequence is
# ended anyway when its request is answered, cancelled or times out.
INFLIGHT_IDLE_US = 600_000_000
_NGC_BASE = (23, 11, 40)  # NGC release 23.11 ships Triton 2.40; one minor version a month since


def triton_version(text: str) -> tuple[int, int]:
    """``2.51`` / ``2.51.0`` (Triton's own version) or ``24.10`` (the NGC container release) -> (2, minor)."""
    match = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?", text.strip())
    if match is None:
        raise ConfigError(
            f"--triton-version {text!r}: give Triton's version (e.g. 2.51) or the NGC release (e.g. 24.10)"
        )
    major, minor = int(match.group(1)), int(match.group(2))
    if major == 2:
        return (2, minor)
    if major >= 20 and 1 <= minor <= 12:  # NGC's YY.MM
        year, month, base = _NGC_BASE
        return (2, base + (major - year) * 12 + (minor - month))
    raise ConfigError(f"--triton-version {text!r}: give Triton's version (e.g. 2.51) or the NGC release (e.g. 24.10)")


class Device(str, enum.Enum):
    cpu = "cpu"
    gpu = "gpu"


@dataclass(frozen=True)
class RepoConfig:
    """Options of ``hrm-deploy triton-repo``."""

    output: Path
    max_batch: int | None = None  # default: engine profile max / export max_batch
    queue_delay_us: int = DEFAULT_QUEUE_DELAY_US
    instances: int = 1  # instances per model (per GPU for GPU models)
    device: Device | None = None  # ONNX graphs: default cpu; engines are always gpu
    onnx_backend: OnnxBackend = OnnxBackend.onnxruntime
    trt_accelerator: str | None = None  # "fp16" / "fp32": onnxruntime backend's TensorRT accelerator (GPU)
    halt: str | None = None  # step models: off | q | threshold:X (None: off; a loop graph: its export's rule)
    names: Sequence[str] = field(default_factory=tuple)  # model names, default from the file names
    overwrite: bool = False
    batching: RepoBatching = RepoBatching.auto
    triton_version: str | None = None  # the Triton the repository is for (default: a current one)
    kserve: bool = False  # also write a KServe InferenceService manifest (kserve.yaml)


@dataclass(frozen=True)
class RepoModel:
    name: str
    kind: str  # "onnxruntime", "tensorrt_plan", "python-ort", "act-driver" (per batch), "act-inflight"
    path: Path  # the model folder
    note: str | None = None  # one line the command prints (why a driver is not in-flight)


def model_name(artifact: Path) -> str:
    """A Triton-safe model name from a file name: ``sudoku-tiny.fp16.onnx`` -> ``sudoku-tiny_fp16``."""
    stem = artifact.name
    for suffix in (".onnx", ".engine", ".plan"):
        stem = stem.removesuffix(suffix)
    return re.sub(r"[^A-Za-z0-9_-]", "_", stem)


def _dims(dims: list[Any]) -> list[int]:
    """Per-request dims: the batch axis dropped; other dynamic dims -1."""
    return [d if isinstance(d, int) else -1 for d in dims[1:]]


def _tensor(name: str, onnx_type: str, dims: list[Any]) -> str:
    if onnx_type not in TRITON_TYPES:
        raise ArtifactError(f"tensor {name} has type {onnx_type}, which Triton configs do not map here")
    per_item = _dims(dims)
    # 1-D graph tensors ([B]) travel as [B, 1] (Triton needs a dim when batching) and are reshaped to [B]
    shape = "dims: [ 1 ]\n    reshape: { shape: [ ] }" if not per_item else f"dims: [ {', '.join(map(str, per_item))} ]"
    return f'  {{\n    name: "{name}"\n    data_type: {TRITON_TYPES[onnx_type]}\n    {shape}\n  }}'


def _io_block(io: dict[str, dict[str, tuple[str, list[Any]]]]) -> str:
    inputs = ",\n".join(_tensor(n, t, d) for n, (t, d) in io["inputs"].items())
    outputs = ",\n".join(_tensor(n, t, d) for n, (t, d) in io["outputs"].items())
    return f"input [\n{inputs}\n]\noutput [\n{outputs}\n]\n"


def _batching(max_batch: int, delay_us: int) -> str:
    preferred = sorted({b for b in (max_batch // 4, max_batch // 2, max_batch) if b >= 1})
    return (
        f"max_batch_size: {max_batch}\n"
        f"dynamic_batching {{\n  preferred_batch_size: [ {', '.join(map(str, preferred))} ]\n"
        f"  max_queue_delay_microseconds: {delay_us}\n}}\n"
    )


def _instances(count: int, device: Device) -> str:
    kind = "KIND_GPU" if device is Device.gpu else "KIND_CPU"
    return f"instance_group [\n  {{\n    count: {count}\n    kind: {kind}\n  }}\n]\n"


def _parameters(params: dict[str, Any]) -> str:
    return "".join(f'parameters {{\n  key: "{k}"\n  value: {{ string_value: "{v}" }}\n}}\n' for k, v in params.items())


def check_config_text(text: str, where: str) -> None:
    """Parse a config.pbtxt with tritonclient's ``model_config_pb2`` (skipped when absent)."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        return
    try:
        text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:  # a bug in this module, not the user's
        raise InternalError(f"generated {where} does not parse as a Triton ModelConfig: {exc}") from exc


def _write_model(folder: Path, config_text: str, files: dict[str, Path | str], manifest: Path | None) -> None:
    """Write one model folder: config.pbtxt, version 1 files (copied paths or text), the manifest."""
    check_config_text(config_text, str(folder / "config.pbtxt"))
    version = folder / "1"
    version.mkdir(parents=True, exist_ok=True)
    for name, src in files.items():
        if isinstance(src, Path):
            shutil.copyfile(src, version / name)
        else:
            (version / name).write_text(src)
    if manifest is not None and manifest.is_file():
        shutil.copyfile(manifest, folder / manifest.name)
    (folder / "config.pbtxt").write_text(config_text)


def _template(name: str) -> str:
    return (Path(__file__).parent / "triton_models" / f"{name}.py").read_text()


def _model_config(
    name: str, contract: Contract, config: RepoConfig, max_batch: int
) -> tuple[str, dict[str, Path | str], str]:
    """(config.pbtxt text, version files, kind) of the model that runs the artifact itself."""
    head = f'name: "{name}"\n'
    if contract.kind == "engine":
        backend = ((contract.manifest.get("backend") or {}).get("name")) or "tensorrt"
        if backend != "tensorrt":
            raise ArtifactError(
                f"{contract.path.name} is a {backend} engine; Triton's tensorrt_plan backend runs "
                "standard TensorRT engines only: build with `hrm-deploy build-engine --backend tensorrt` "
                "or put the ONNX graph in the repository"
            )
        head += 'platform: "tensorrt_plan"\n'
        files: dict[str, Path | str] = {"model.plan": contract.path}
        device, kind = Device.gpu, "tensorrt_plan"
    elif config.onnx_backend is OnnxBackend.python:
        if config.device is Device.gpu or config.trt_accelerator:
            raise ConfigError("--onnx-backend python runs ONNX Runtime on CPU; use --onnx-backend onnxruntime for GPUs")
        head += 'backend: "python"\n'
        files = {"model.onnx": contract.path, "model.py": _template("ort_model")}
        device, kind = Device.cpu, "python-ort"
    else:
        head += 'backend: "onnxruntime"\n'
        files = {"model.onnx": contract.path}
        device, kind = config.device or Device.cpu, "onnxruntime"
        if config.trt_accelerator:
            if device is not Device.gpu:
                raise ConfigError("--trt-accelerator needs --device gpu (ONNX Runtime's TensorRT provider is GPU-only)")
            head += (
                "optimization {\n  execution_accelerators {\n    gpu_execution_accelerator: [ {\n"
                '      name: "tensorrt"\n'
                f'      parameters {{ key: "precision_mode" value: "{config.trt_accelerator.upper()}" }}\n'
                '      parameters { key: "max_workspace_size_bytes" value: "1073741824" }\n'
                "    } ]\n  }\n}\n"
            )
    text = (
        head
        + _batching(max_batch, config.queue_delay_us)
        + _io_block(contract.io)
        + _instances(config.instances, device)
    )
    return text, files, kind


def _driver_config(
    name: str, step_name: str, contract: Contract, config: RepoConfig, max_batch: int, inflight: bool
) -> str:
    """The ACT driver's config.pbtxt: per batch behind the dynamic batcher, or in-flight (iterative
    sequences of one puzzle each, as many candidates as the max batch, no queue delay)."""
    from hrm_deploy.halting import halts_on_q_halt_alone

    s, v = contract.seq_len, contract.vocab_size
    carry = contract.io["inputs"][CARRY[0]][1]  # ["batch", S + prefix, hidden]
    io = {
        "inputs": {"inputs": ("INT32", ["batch", s]), "puzzle_identifiers": ("INT32", ["batch", 1])},
        "outputs": {
            "answer": ("INT32", ["batch", s]),
            "logits": ("FLOAT", ["batch", s, v]),
            "q_halt_logits": ("FLOAT", ["batch", contract.steps]),
            "steps": ("INT32", ["batch", 1]),
        },
    }
    halt = config.halt or "off"
    params: dict[str, Any] = {
        "step_model": step_name,
        # the step graph's contract (hrm_deploy.contract): the driver is self-contained, so it
        # reads the names from here rather than importing them
        "step_inputs": ",".join(STEP_INPUTS),
        "step_outputs": ",".join(STEP_OUTPUTS),
        "steps": contract.steps,
        "carry_len": carry[1],
        "hidden_size": carry[2],
        "vocab_size": v,
        "num_puzzle_identifiers": contract.num_puzzle_identifiers,
        # the model's own q rule: q_halt > 0 for a model trained without the continue logit (TRM)
        "halt": "q0" if halt == "q" and halts_on_q_halt_alone(contract.path) else halt,
        "schedule": "inflight" if inflight else "batch",
    }
    if inflight:
        params["max_live"] = max_batch
        batching = (
            f"max_batch_size: {max_batch}\n"
            "sequence_batching {\n  iterative_sequence: true\n"
            f"  max_sequence_idle_microseconds: {INFLIGHT_IDLE_US}\n"
            f"  oldest {{\n    max_candidate_sequences: {max_batch}\n    preferred_batch_size: [ {max_batch} ]\n"
            "    max_queue_delay_microseconds: 0\n  }\n"
            '  control_input [\n    {\n      name: "START"\n'
            "      control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ]\n    }\n  ]\n}\n"
        )
    else:
        batching = _batching(max_batch, config.queue_delay_us)
    return (
        f'name: "{name}"\nbackend: "python"\n'
        + batching
        + _io_block(io)
        + _instances(config.instances, Device.cpu)
        + _parameters(params)
    )


def _inflight(config: RepoConfig) -> tuple[bool, str | None]:
    """(whether step models get the in-flight driver, a line saying why not where one was wanted)."""
    halting = (config.halt or "off") != "off"
    wanted = config.batching is RepoBatching.inflight or (config.batching is RepoBatching.auto and halting)
    if not wanted:
        return False, None
    if config.triton_version is not None:
        version = triton_version(config.triton_version)
        if version < MIN_INFLIGHT_TRITON:
            need = ".".join(map(str, MIN_INFLIGHT_TRITON))
            why = (
                f"Triton {version[0]}.{version[1]} cannot run the in-flight ACT driver (it needs request rescheduling "
                f"with iterative sequences: Triton {need} / NGC 23.12 or later); wrote the per-batch ACT driver"
            )
            if config.batching is RepoBatching.inflight:
                raise ConfigError(f"--batching inflight: {why.split(';')[0]}; use a newer Triton or --batching dynamic")
            return False, why
    return True, None


def check_loop_halt(contract: Contract, halt: str | None) -> None:
    """A loop graph halts by the rule fixed at its export: ``--halt`` may only repeat it."""
    if contract.mode != "loop" or halt is None:
        return
    recorded = contract.manifest.get("halt") or {}
    exported = recorded.get("rule") if isinstance(recorded, dict) else None
    exported = str(exported or "off")
    if halt != exported:
        raise ConfigError(
            f"--halt {halt}: {contract.path.name} is a loop graph, which halts by the rule fixed at its export "
            f"({exported}); drop --halt, or export it again with `hrm-deploy export --mode loop --halt {halt}`"
        )


def write_triton_repo(artifacts: Sequence[str | Path], config: RepoConfig) -> list[RepoModel]:
    """Write a Triton model repository for ``artifacts`` (ONNX graphs and engines with manifests).

    Returns the models written. Refuses an existing non-empty output unless ``overwrite``."""
    if not artifacts:
        raise ConfigError("give at least one ONNX graph or engine")
    if config.halt is not None and not HALT_RULE.match(config.halt):
        raise ConfigError(
            f"--halt {config.halt!r}: the ACT driver knows off, q or threshold:X with 0 < X < 1 "
            "(budget:P needs calibration: calibrate with `hrm-deploy verify` and pass threshold:X)"
        )
    if config.instances < 1 or config.queue_delay_us < 0:
        raise ConfigError("--instances must be >= 1 and --queue-delay-us >= 0")
    names = list(config.names) or [model_name(Path(a)) for a in artifacts]
    if len(names) != len(artifacts) or len(set(names)) != len(names):
        raise ConfigError(f"model names {names} must be one per artifact and distinct; pass --name for each")
    for n in names:
        check_model_name(n)
    contracts = [read_contract(a) for a in artifacts]
    inflight, note = _inflight(config)
    for c in contracts:
        check_loop_halt(c, config.halt)
        if c.kind == "checkpoint":
            raise ArtifactError(
                f"{c.path} is a checkpoint; export it first (`hrm-deploy export`), Triton runs "
                "ONNX graphs and TensorRT engines"
            )
        if "puzzle_emb_rows" in (c.io.get("inputs") or {}):
            raise ArtifactError(
                f"{c.path.name} takes puzzle-embedding rows (exported with --puzzle-emb external) and Triton's "
                "backends cannot gather them from its table; serve it with `hrm-deploy serve` (which does), or "
                "export with the table embedded for a Triton repository"
            )
        if c.kind == "pt2":
            raise ArtifactError(
                f"{c.path} is a PyTorch (AOTInductor) engine, which Triton has no backend for; serve it with "
                "`hrm-deploy serve`, or put the ONNX graph it was built from in the repository"
            )
    out = Path(os.path.abspath(config.output))  # "." has a real parent to stage in
    check_repo_output(out, [Path(a) for a in artifacts], config.overwrite)
    written: list[RepoModel] = []
    # Build the whole repository in a private staging folder beside it and rename: never half a
    # repository, and a killed run's staging is removed by the next write there.
    with staging_dir(out.parent, "stage") as staging:
        tmp = staging / "repo"
        tmp.mkdir()
        from hrm_deploy.manifest import manifest_path

        for name, contract in zip(names, contracts):
            max_batch = contract.max_batch if config.max_batch is None else config.max_batch
            if not 1 <= max_batch <= contract.max_batch:
                raise ConfigError(
                    f"--max-batch {max_batch}: give 1..{contract.max_batch}, the largest batch "
                    f"{contract.path.name} was made for (export or build it with a larger --max-batch for more)"
                )
            step = contract.mode == "step"
            own = f"{name}_step" if step else name
            text, files, kind = _model_config(own, contract, config, max_batch)
            _write_model(tmp / own, text, files, manifest_path(contract.path))
            written.append(RepoModel(own, kind, out / own))
            if step:
                driver = _driver_config(name, own, contract, config, max_batch, inflight)
                _write_model(tmp / name, driver, {"model.py": _template("act_driver")}, manifest_path(contract.path))
                kind = "act-inflight" if inflight else "act-driver"
                written.append(RepoModel(name, kind, out / name, note))
        entries = [m.name for m in written]
        if config.kserve:
            gpu = any(m.kind == "tensorrt_plan" for m in written) or config.device is Device.gpu
            text = kserve_manifest(kserve_name(names[0]), written, gpu, config.triton_version)
            if config.onnx_backend is OnnxBackend.python:
                text = (
                    "# --onnx-backend python: the image needs the onnxruntime Python package (NGC's tritonserver images\n"
                    "# do not have it); write the repository with the default onnxruntime backend for these images.\n"
                ) + text
            (tmp / KSERVE_FILE).write_text(text)
            entries.append(KSERVE_FILE)
        (tmp / REPO_MARKER).write_text(json.dumps({"tool": "hrm-deploy", "models": entries}, indent=2) + "\n")
        if out.exists():  # checked above: a repository of ours; moved aside, removed with the staging
            out.rename(staging / "old")
        tmp.rename(out)
    return written


KSERVE_FILE = "kserve.yaml"  # written in the repository with --kserve
STORAGE_URI_PLACEHOLDER = "s3://YOUR-BUCKET/PATH/TO/THIS/REPOSITORY"
TESTED_TRITON = "2.51"  # PyTriton 0.7.0's bundled tritonserver: the release the repositories are tested on


def ngc_release(version: tuple[int, int]) -> str:
    """The NGC container release (``24.10``) that ships Triton ``version`` (2.51)."""
    year, month, base = _NGC_BASE
    months = year * 12 + (month - 1) + version[1] - base
    return f"{months // 12:02d}.{months % 12 + 1:02d}"


def kserve_manifest(name: str, models: Sequence[RepoModel], gpu: bool, triton: str | None) -> str:
    """A ``ServingRuntime`` running Triton's NGC image on the repository KServe mounts at /mnt/models
    (HTTP 8080, gRPC 9000, metrics 8002, as KServe's own Triton runtime) and an ``InferenceService``
    of model format ``triton`` on it; ``storageUri`` is a placeholder the user replaces with where
    the repository was uploaded. GPU models ask for one ``nvidia.com/gpu``."""
    import yaml

    image = f"nvcr.io/nvidia/tritonserver:{ngc_release(triton_version(triton or TESTED_TRITON))}-py3"
    limits: dict[str, str] = {"cpu": "2", "memory": "4Gi"}
    if gpu:
        limits["nvidia.com/gpu"] = "1"
    runtime = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": {"name": f"{name}-triton"},
        "spec": {
            "annotations": {"prometheus.kserve.io/port": "8002", "prometheus.kserve.io/path": "/metrics"},
            "supportedModelFormats": [{"name": "triton", "version": "2", "autoSelect": False}],
            "protocolVersions": ["v2", "grpc-v2"],
            "containers": [
                {
                    "name": "kserve-container",
                    "image": image,
                    "args": [
                        "tritonserver",
                        "--model-store=/mnt/models",
                        "--grpc-port=9000",
                        "--http-port=8080",
                        "--allow-grpc=true",
                        "--allow-http=true",
                        "--metrics-port=8002",
                    ],
                    "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": limits},
                }
            ],
        },
    }
    service = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": name, "annotations": {"hrm-deploy/models": ",".join(m.name for m in models)}},
        "spec": {
            "predictor": {
                "model": {
                    "modelFormat": {"name": "triton", "version": "2"},
                    "runtime": f"{name}-triton",
                    "protocolVersion": "v2",
                    "storageUri": STORAGE_URI_PLACEHOLDER,
                    "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": limits},
                }
            }
        },
    }
    head = (
        "# Written by hrm-deploy triton-repo --kserve. Upload this repository (the folder holding this file) to\n"
        "# object storage, set storageUri below to it, then: kubectl apply -f kserve.yaml\n"
    )
    return head + yaml.safe_dump_all([runtime, service], sort_keys=False)


def kserve_name(model: str) -> str:
    """A Kubernetes resource name (lower-case letters, digits and '-', starting with a letter) from a model name."""
    name = re.sub(r"[^a-z0-9-]+", "-", model.lower()).strip("-")
    name = re.sub(r"^[^a-z]+", "", name)[:50].rstrip("-")
    return name or "hrm"


def check_model_name(name: str) -> None:
    """A plain Triton model name (letters, digits, ``_``, ``-``): never a path such as ``../x``."""
    if not MODEL_NAME.match(name):
        raise ConfigError(
            f"--name {name!r} is not a plain model name; use 1-100 letters, digits, '_' or '-' "
            "(no '/', '.', spaces), e.g. sudoku_fp16"
        )


def _is_ours(out: Path) -> str | None:
    """None when ``out`` is a repository this tool wrote (its marker lists every entry), else why not."""
    marker = out / REPO_MARKER
    try:
        data = json.loads(marker.read_text()) if marker.is_file() and not marker.is_symlink() else None
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict) or data.get("tool") != "hrm-deploy" or not isinstance(data.get("models"), list):
        return f"it has no {REPO_MARKER} marker (hrm-deploy writes one in every repository)"
    ours = {str(m) for m in data["models"]} | {REPO_MARKER}
    foreign = sorted(e.name for e in out.iterdir() if e.name not in ours or e.is_symlink())
    if foreign:
        return f"it holds entries hrm-deploy did not write ({', '.join(foreign[:5])})"
    return None


def check_repo_output(out: Path, artifacts: Sequence[Path], overwrite: bool) -> None:
    """Refuse an output folder that is a link, a file, holds one of the inputs, or (unless it is an
    empty folder, or ``overwrite`` and a repository this tool wrote) exists at all."""
    if out.is_symlink():
        raise ConfigError(f"-o {out} is a symbolic link; give the real folder path")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"-o {out} exists and is not a folder; choose another -o")
    real = out.resolve()
    for a in artifacts:
        if Path(a).resolve().is_relative_to(real):
            raise ConfigError(f"-o {out} holds the input {a}; write the repository to another folder")
    if not out.exists() or not any(out.iterdir()):
        return
    why = _is_ours(out)
    if not overwrite:
        raise ConfigError(f"{out} exists and is not empty; choose another -o or pass --overwrite")
    if why is not None:
        raise ConfigError(
            f"--overwrite replaces only a repository hrm-deploy wrote, and {out} is not one: {why}; choose another -o"
        )
