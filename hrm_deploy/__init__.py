"""hrm-deploy: take trained Hierarchical Reasoning Model checkpoints to edge inference.

The pipeline, one public function per stage (each importable from here)::

    load_checkpoint -> unroll -> export_onnx -> make_precision_graph -> build_engine
        -> open_runner -> hrm_deploy.verify.verify / hrm_deploy.bench.run.bench

``verify``, ``bench`` and ``train`` are not re-exported under those names: each is also a
submodule of this package, and importing a submodule makes ``hrm_deploy.<name>`` the module.

Importing this package is cheap: torch, onnx, onnxruntime and tensorrt are only
imported by the functions that need them.
"""

from __future__ import annotations

__version__ = "0.1.0"

# Lazy attribute access keeps `import hrm_deploy` free of heavy imports: name -> defining module.
# tests/test_package.py checks that every name here resolves.
_LAZY = {
    "HRMDeployError": "hrm_deploy.errors",
    "HRMConfig": "hrm_deploy.model.config",
    "TRMConfig": "hrm_deploy.model.trm_config",
    "build_model": "hrm_deploy.model.hrm",
    "load_checkpoint": "hrm_deploy.model.checkpoint",
    "unroll": "hrm_deploy.export.unroll",
    "ExportConfig": "hrm_deploy.export.onnx_export",
    "export_onnx": "hrm_deploy.export.onnx_export",
    "PrecisionConfig": "hrm_deploy.precision.convert",
    "make_precision_graph": "hrm_deploy.precision.convert",
    "EngineConfig": "hrm_deploy.engines.build",
    "build_engine": "hrm_deploy.engines.build",
    "open_runner": "hrm_deploy.backends",
    "Thresholds": "hrm_deploy.verify",
    "BenchConfig": "hrm_deploy.bench.run",
    "TrainConfig": "hrm_deploy.train.config",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hrm_deploy' has no attribute {name!r}")


__all__ = ["__version__", *_LAZY]
