"""What an artifact takes and gives, read without running it (manifest first, then the file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hrm_deploy.errors import ArtifactError

# ONNX tensor type names (manifest "io") -> Triton config data types
TRITON_TYPES = {"INT32": "TYPE_INT32", "INT64": "TYPE_INT64", "FLOAT": "TYPE_FP32", "FLOAT16": "TYPE_FP16",
                "BFLOAT16": "TYPE_BF16", "BOOL": "TYPE_BOOL"}
ENGINE_SUFFIXES = (".engine", ".plan")


@dataclass(frozen=True)
class Contract:
    """Sizes and I/O of one artifact.

    ``io`` maps "inputs"/"outputs" -> name -> (ONNX type name, dims with "batch" first); it is
    empty for checkpoints (they are served through a runner only, never put in a repository).
    """

    path: Path
    kind: str  # "onnx", "engine", "checkpoint"
    mode: str  # "unrolled" or "step"
    steps: int
    seq_len: int
    vocab_size: int
    num_puzzle_identifiers: int
    max_batch: int
    io: dict[str, dict[str, tuple[str, list[Any]]]] = field(default_factory=dict)
    manifest: dict[str, Any] = field(default_factory=dict)
    target: str | None = None  # engines: the target profile they were built for


def _kind(path: Path) -> str:
    if path.suffix == ".onnx":
        return "onnx"
    if path.suffix in ENGINE_SUFFIXES:
        return "engine"
    return "checkpoint"


def read_contract(artifact: str | Path) -> Contract:
    """The :class:`Contract` of an ONNX graph, engine or checkpoint.

    ONNX graphs and engines are read from their manifests (an engine's I/O and model sizes come
    from its parent ONNX's manifest); a checkpoint is loaded (torch) for its config.
    """
    from hrm_deploy.manifest import manifest_path, read_manifest

    path = Path(artifact)
    if not path.exists():
        raise ArtifactError(f"{path} does not exist; give an ONNX graph, an engine or a checkpoint")
    kind = _kind(path)
    if kind == "checkpoint":
        from hrm_deploy.model.checkpoint import load_checkpoint

        _, cfg = load_checkpoint(path)
        return Contract(path, kind, "unrolled", cfg.halt_max_steps, cfg.seq_len, cfg.vocab_size,
                        cfg.num_puzzle_identifiers, 64)
    if not manifest_path(path).is_file():
        raise ArtifactError(f"{path} has no manifest ({manifest_path(path).name}); re-create it with "
                            "`hrm-deploy export` / `hrm-deploy build-engine` so its I/O is known")
    manifest = read_manifest(path)
    source = manifest
    target = None
    if kind == "engine":
        target = (manifest.get("target") or {}).get("name")
        parent = Path((manifest.get("parent") or {}).get("path", ""))
        if not manifest_path(parent).is_file():
            raise ArtifactError(f"engine {path.name}: its parent ONNX manifest {manifest_path(parent)} is missing; "
                                "keep the ONNX graph (and its manifest) it was built from beside it")
        source = read_manifest(parent)
    model = (source.get("config") or {}).get("model")
    io = source.get("io")
    if not model or not io:
        raise ArtifactError(f"manifest of {path.name} lacks the model config or I/O; re-export it")
    io = {side: {n: (t, list(d)) for n, (t, d) in io[side].items()} for side in ("inputs", "outputs")}
    if kind == "engine":
        max_batch = int(manifest["profile_shapes"]["inputs"][2][0])  # [min, opt, max] shapes
        mode, steps = manifest.get("mode", source.get("mode", "unrolled")), int(manifest.get("steps", 1))
    else:
        max_batch = int(manifest.get("max_batch", 64))
        mode, steps = manifest.get("mode", "unrolled"), int((manifest.get("unroll") or {}).get("steps", 1))
    if mode == "step":
        steps = int(model.get("halt_max_steps", steps))
    return Contract(path, kind, mode, steps, int(model["seq_len"]), int(model["vocab_size"]),
                    int(model.get("num_puzzle_identifiers", 1)), max_batch, io, manifest, target)
