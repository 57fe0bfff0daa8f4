"""``inspect_artifact``: what a checkpoint, ONNX file or manifest holds, as a dict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hrm_deploy.errors import ArtifactError
from hrm_deploy.manifest import MANIFEST_SUFFIX, read_manifest


def _onnx_summary(path: Path) -> dict[str, Any]:
    from hrm_deploy.errors import require

    onnx = require("onnx", "onnx", "Inspecting ONNX files")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf raises several unrelated types
        raise ArtifactError(f"{path} is not a readable ONNX file ({type(exc).__name__}); re-export it") from None

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
    ops: dict[str, int] = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return {
        "kind": "onnx", "path": str(path), "size_bytes": path.stat().st_size,
        "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "inputs": io(model.graph.input), "outputs": io(model.graph.output),
        "nodes": len(model.graph.node), "initializer_elements": params,
        "top_ops": dict(sorted(ops.items(), key=lambda kv: -kv[1])[:8]),
        "metadata": {p.key: p.value for p in model.metadata_props},
    }


def _checkpoint_summary(path: Path) -> dict[str, Any]:
    from hrm_deploy.model.checkpoint import read_checkpoint

    contents = read_checkpoint(path)
    tensors = sum(int(v.numel()) for v in contents.state_dict.values())
    return {
        **contents.describe(), "kind": f"checkpoint ({contents.kind})",
        "size_bytes": contents.path.stat().st_size,
        "parameters": contents.config.parameter_count(), "tensor_elements": tensors,
        "keys": len(contents.state_dict), "config": contents.config.to_dict(),
        "metrics": contents.extra.get("metrics"),
    }


def inspect_artifact(path: str | Path) -> dict[str, Any]:
    """Summarise ``path``: an ONNX graph, a ``*.manifest.json`` or a checkpoint (file or folder)."""
    p = Path(path)
    if not p.exists():
        raise ArtifactError(f"{p} does not exist")
    if p.name.endswith(MANIFEST_SUFFIX) or (p.suffix == ".json" and p.is_file()):
        data = read_manifest(p) if p.name.endswith(MANIFEST_SUFFIX) else json.loads(p.read_text())
        return {"kind": "manifest", "path": str(p), **data}
    if p.suffix == ".onnx":
        summary = _onnx_summary(p)
        try:
            summary["manifest"] = {k: v for k, v in read_manifest(p).items() if k in ("stage", "created", "precision", "mode", "parity")}
        except ArtifactError:
            summary["manifest"] = None
        return summary
    return _checkpoint_summary(p)
