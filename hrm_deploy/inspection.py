"""``inspect_artifact``: what a checkpoint, ONNX file or manifest holds, as a dict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hrm_deploy.artifacts import MAX_PARENT_LINKS, is_checkpoint, runner_name
from hrm_deploy.errors import ArtifactError, HRMDeployError, require
from hrm_deploy.manifest import MANIFEST_SUFFIX, check_artifact, manifest_path, read_manifest, validate_manifest
from hrm_deploy.registry import BACKENDS
from hrm_deploy.sources import hub_origin

# Manifest fields that judge or describe the artifact's bytes; dropped when the bytes no longer match
# (or the graph's own metadata contradicts them)
_JUDGEMENTS = ("verify", "parity", "report", "build", "precision", "mode", "steps")


def _onnx_summary(path: Path) -> dict[str, Any]:
    from hrm_deploy.onnx_runtime import load_onnx

    onnx = require("onnx", "onnx", "Inspecting ONNX files")
    model = load_onnx(path)  # size-checked first: a FIFO, /dev/zero or random bytes are one line

    def io(values) -> dict[str, str]:
        out = {}
        for v in values:
            t = v.type.tensor_type
            dims = [d.dim_param or d.dim_value for d in t.shape.dim]
            out[v.name] = f"{onnx.TensorProto.DataType.Name(t.elem_type)}{dims}"
        return out

    params = 0
    for init in model.graph.initializer:
        n = 1
        for d in init.dims:
            n *= d
        params += n
    metadata = {p.key: p.value for p in model.metadata_props}
    ops: dict[str, int] = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return {
        "kind": "onnx",
        "path": str(path),
        "size_bytes": path.stat().st_size,
        "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "inputs": io(model.graph.input),
        "outputs": io(model.graph.output),
        "nodes": len(model.graph.node),
        "initializer_elements": params,
        "top_ops": dict(sorted(ops.items(), key=lambda kv: -kv[1])[:8]),
        "metadata": metadata,
        "model": _model_description(metadata.get("hrm_deploy.config")),
    }


def _model_description(config_json: str | None) -> dict[str, Any] | None:
    """The model family and its recursion from a graph's recorded config (None if absent)."""
    if not config_json:
        return None
    from hrm_deploy.model.families import config_from_dict, describe

    try:
        return describe(config_from_dict(json.loads(config_json)))
    except (json.JSONDecodeError, TypeError, HRMDeployError):
        return None


def _checkpoint_summary(path: Path) -> dict[str, Any]:
    from hrm_deploy.model.checkpoint import read_checkpoint
    from hrm_deploy.model.families import describe

    contents = read_checkpoint(path)
    tensors = sum(int(v.numel()) for v in contents.state_dict.values())
    return {
        **contents.describe(),
        "kind": f"checkpoint ({contents.kind})",
        "size_bytes": contents.path.stat().st_size,
        "parameters": contents.config.parameter_count(),
        "tensor_elements": tensors,
        "keys": len(contents.state_dict),
        "model": describe(contents.config),
        "config": contents.config.to_dict(),
        "metrics": contents.extra.get("metrics"),
        **({"hub": hub} if (hub := hub_origin(contents.path)) else {}),
    }


def hub_record(artifact: Path, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """Which published weights an artifact came from: its manifest's ``hub`` record, else the first
    one up its parent links (an engine -> its ONNX -> the checkpoint in the Hub cache). Each link is
    followed only when the parent's sha256 matches the record."""
    from hrm_deploy.manifest import resolve_parent

    current, data = artifact, manifest
    for _ in range(MAX_PARENT_LINKS):
        if isinstance(data.get("hub"), dict):
            return data["hub"]
        try:
            parent = resolve_parent(current, data)
        except ArtifactError:
            return None
        if parent is None:
            return None
        origin = hub_origin(parent)
        if origin is not None or not manifest_path(parent).is_file():
            return origin
        current, data = parent, read_manifest(parent)
    return None


def _artifact_status(artifact: Path) -> str:
    """ "ok" when ``artifact`` matches its manifest (and, for a graph, the manifest says what the
    graph's own metadata says), else the one-line reason it does not."""
    try:
        manifest = check_artifact(artifact, require_manifest=True)
        if artifact.suffix == ".onnx":
            from hrm_deploy.export.metadata import graph_metadata, manifest_mismatch
            from hrm_deploy.onnx_runtime import load_onnx

            wrong = manifest_mismatch(graph_metadata(load_onnx(artifact)), manifest)
            if wrong:
                return f"{artifact.name}: {wrong}"
    except ArtifactError as exc:
        return str(exc)
    return "ok"


def inspect_artifact(path: str | Path) -> dict[str, Any]:
    """Summarise ``path``: an ONNX graph, a ``*.manifest.json`` or a checkpoint (file or folder).

    A manifest is shown with ``artifact_check``: "ok" when the artifact beside it still has the
    recorded sha256; otherwise the reason, and its verify/parity results are left out (they
    describe other bytes)."""
    p = Path(path)
    if not p.exists():
        raise ArtifactError(f"{p} does not exist")
    if p.name.endswith(MANIFEST_SUFFIX) or (p.suffix == ".json" and p.is_file()):
        if p.name.endswith(MANIFEST_SUFFIX):
            data = read_manifest(p)
        else:
            try:
                raw = json.loads(p.read_bytes())
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                raise ArtifactError(f"{p} is not valid JSON") from None
            data = validate_manifest(raw, p)
        artifact = p.with_name(str(data["artifact"])) if p.name.endswith(MANIFEST_SUFFIX) else None
        status = (
            _artifact_status(artifact)
            if artifact is not None and Path(str(data["artifact"])).name == str(data["artifact"])
            else "not checked (manifest not beside its artifact)"
        )
        if status != "ok":
            data = {k: v for k, v in data.items() if k not in _JUDGEMENTS}
        hub = hub_record(artifact, data) if artifact is not None and status == "ok" else None
        return {"kind": "manifest", "path": str(p), "artifact_check": status, **data, **({"hub": hub} if hub else {})}
    if p.suffix == ".onnx":
        summary = _onnx_summary(p)
        status = _artifact_status(p)
        summary["artifact_check"] = status
        if status == "ok":
            summary["manifest"] = {
                k: v
                for k, v in read_manifest(p).items()
                if k in ("stage", "created", "precision", "mode", "parity", "verify", "source", "checkpoint_overrides")
            }
            hub = hub_record(p, read_manifest(p))
            summary["manifest"].update({"hub": hub} if hub else {})
        else:
            summary["manifest"] = None
        return summary
    if not is_checkpoint(p):
        # engines (TensorRT, PyTorch .pt2) are opaque here (no TensorRT or compile needed): what the
        # manifest says, if it still applies
        if not p.is_file():
            raise ArtifactError(f"{p} is not a file; give an engine file")
        status = _artifact_status(p)
        kind = "engine (PyTorch AOTInductor)" if BACKENDS[runner_name(p)].kind == "pt2" else "engine"
        summary = {"kind": kind, "path": str(p), "size_bytes": p.stat().st_size, "artifact_check": status}
        if status == "ok":
            summary["manifest"] = {
                k: v
                for k, v in read_manifest(p).items()
                if k
                in (
                    "stage",
                    "created",
                    "precision",
                    "mode",
                    "steps",
                    "backend",
                    "target",
                    "compute_capability",
                    "profile_shapes",
                    "onnx_sha256",
                    "device",
                    "compile_path",
                    "model_config",
                    "checkpoint_overrides",
                    "verify",
                )
            }
            hub = hub_record(p, read_manifest(p))
            summary["manifest"].update({"hub": hub} if hub else {})
        return summary
    return _checkpoint_summary(p)
