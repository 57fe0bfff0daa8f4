"""hrm-deploy: take trained Hierarchical Reasoning Model checkpoints to edge inference.

The pipeline, one public function per stage::

    load_checkpoint -> unroll -> export_onnx -> (precision) -> build_engine -> verify / bench

Importing this package is cheap: torch, onnx, onnxruntime and tensorrt are only
imported by the functions that need them.
"""

from __future__ import annotations

__version__ = "0.1.0"

# Lazy attribute access keeps `import hrm_deploy` free of heavy imports.
_LAZY = {
    "HRMConfig": "hrm_deploy.model.config",
    "load_checkpoint": "hrm_deploy.model.checkpoint",
    "unroll": "hrm_deploy.export.unroll",
    "export_onnx": "hrm_deploy.export.onnx_export",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hrm_deploy' has no attribute {name!r}")


__all__ = ["__version__", *_LAZY]
