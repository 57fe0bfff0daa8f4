"""What every engine builder returns, takes by default and reads from an export's record: shared
by the builders (TensorRT, cpu target, PyTorch) without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hrm_deploy.engines.targets import ENGINE_PRECISIONS
from hrm_deploy.errors import ArtifactError
from hrm_deploy.manifest import read_manifest

# model-config fields an upstream checkpoint may lack (they live in its dataset.json), which an
# export of it recorded: a later stage reloading the checkpoint needs them again
DATA_FIELDS = ("seq_len", "vocab_size", "num_puzzle_identifiers")


@dataclass
class EngineResult:
    path: Path
    manifest: Path
    source_onnx: Path
    build: dict[str, Any] = field(default_factory=dict)


def recorded_data_fields(artifact: str | Path) -> dict[str, Any]:
    """The data-dependent model fields ``artifact``'s export manifest recorded ({} when none), for
    reloading its checkpoint exactly as it was exported (an upstream checkpoint whose dataset.json
    is absent needs them)."""
    manifest = read_manifest(Path(artifact)) or {}
    model = (manifest.get("config") or {}).get("model") or {}
    return {k: model[k] for k in DATA_FIELDS if model.get(k) is not None}


def newest_export(folder: str | Path = "export") -> Path:
    """The most recently written FP32 export in ``folder``."""
    candidates = [
        p
        for p in Path(folder).glob("*.onnx")
        if not p.name.startswith(".")  # temp files
        and not any(p.name.endswith(f".{x}.onnx") for x in ENGINE_PRECISIONS[1:])
    ]
    if not candidates:
        raise ArtifactError(f"no ONNX export in {folder}/; run `hrm-deploy export` first or pass the ONNX path")
    return max(candidates, key=lambda p: p.stat().st_mtime)
