"""What an artifact takes and gives, read without running it (manifest first, then the file).

Below the applications: ``serve``, ``triton-repo``, ``solve`` and ``arc-eval`` read an artifact's
sizes and I/O through :func:`read_contract` before they open a runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hrm_deploy.errors import ArtifactError


@dataclass(frozen=True)
class Contract:
    """Sizes and I/O of one artifact.

    ``io`` maps "inputs"/"outputs" -> name -> (ONNX type name, dims with "batch" first); it is
    empty for checkpoints (they are served through a runner only, never put in a repository).
    """

    path: Path
    kind: str  # "onnx", "engine", "pt2", "checkpoint"
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
    """The artifact kind from the backend table (:data:`hrm_deploy.registry.BACKENDS`)."""
    from hrm_deploy.registry import artifact_kind

    return artifact_kind(path)


def _pt2_contract(path: Path) -> Contract:
    """A PyTorch engine's contract: its manifest records the model config, mode, steps and profile."""
    from hrm_deploy.manifest import check_artifact

    manifest = check_artifact(path, require_manifest=True) or {}
    model = manifest.get("model_config") or {}
    try:
        max_batch = int((manifest.get("profile_shapes") or {})["batch"][1])
        steps = int(model["halt_max_steps"] if manifest.get("mode") == "step" else manifest["steps"])
        sizes = int(model["seq_len"]), int(model["vocab_size"]), int(model.get("num_puzzle_identifiers", 1))
    except (KeyError, TypeError, ValueError, IndexError):
        raise ArtifactError(
            f"manifest of {path.name} lacks the model config, steps or batch profile; rebuild it with "
            "`hrm-deploy build-engine --backend torch`"
        ) from None
    return Contract(path, "pt2", str(manifest.get("mode") or "step"), steps, *sizes, max_batch, {}, manifest)


def read_contract(artifact: str | Path) -> Contract:
    """The :class:`Contract` of an ONNX graph, engine (TensorRT or PyTorch ``.pt2``) or checkpoint.

    ONNX graphs and engines are read from their manifests (an engine's I/O and model sizes come
    from its parent ONNX's manifest); a checkpoint is loaded (torch) for its config.
    """
    from hrm_deploy.manifest import check_artifact, manifest_path, resolve_parent

    path = Path(artifact)
    if not path.exists():
        raise ArtifactError(f"{path} does not exist; give an ONNX graph, an engine or a checkpoint")
    kind = _kind(path)
    if kind == "checkpoint":
        from hrm_deploy.model.checkpoint import load_checkpoint

        _, cfg = load_checkpoint(path)
        return Contract(
            path, kind, "unrolled", cfg.halt_max_steps, cfg.seq_len, cfg.vocab_size, cfg.num_puzzle_identifiers, 64
        )
    if kind == "pt2":
        return _pt2_contract(path)
    if not manifest_path(path).is_file():
        raise ArtifactError(
            f"{path} has no manifest ({manifest_path(path).name}); re-create it with "
            "`hrm-deploy export` / `hrm-deploy build-engine` so its I/O is known"
        )
    manifest = check_artifact(path, require_manifest=True) or {}  # the bytes are what the manifest says
    target = (manifest.get("target") or {}).get("name") if kind == "engine" else None
    # The model config and I/O live in the FP32 export's manifest; precision graphs and engines
    # point to it through their "parent" (engine -> precision graph -> export), I/O unchanged.
    source, where = manifest, path
    for _ in range(4):
        if (source.get("config") or {}).get("model") and source.get("io"):
            break
        parent = resolve_parent(where, source)  # sha256-checked, relative to the manifest
        if parent is None or not manifest_path(parent).is_file():
            named = (source.get("parent") or {}).get("path") or "(none)"
            raise ArtifactError(
                f"{where.name}'s manifest names no model config/I/O and its parent {named} or its "
                "manifest is missing; keep the ONNX graphs an artifact was made from (with their "
                "manifests) where they were, or re-export"
            )
        source, where = check_artifact(parent, require_manifest=True) or {}, parent
    model, io = (source.get("config") or {}).get("model"), source.get("io")
    if not model or not io:
        raise ArtifactError(f"manifest of {path.name} lacks the model config or I/O; re-export it")
    io = {side: {n: (t, list(d)) for n, (t, d) in io[side].items()} for side in ("inputs", "outputs")}
    if kind == "engine":
        max_batch = int(manifest["profile_shapes"]["inputs"][2][0])  # [min, opt, max] shapes
    else:
        max_batch = int(manifest.get("max_batch", source.get("max_batch", 64)))
    mode = manifest.get("mode") or source.get("mode") or "unrolled"
    steps = int(
        manifest.get("steps")
        or (manifest.get("unroll") or {}).get("steps")
        or (source.get("unroll") or {}).get("steps")
        or 1
    )
    if mode == "step":
        steps = int(model.get("halt_max_steps", steps))
    return Contract(
        path,
        kind,
        mode,
        steps,
        int(model["seq_len"]),
        int(model["vocab_size"]),
        int(model.get("num_puzzle_identifiers", 1)),
        max_batch,
        io,
        manifest,
        target,
    )
