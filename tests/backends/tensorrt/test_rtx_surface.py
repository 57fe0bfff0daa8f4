"""Every TensorRT name the engine code uses exists on the installed ``tensorrt_rtx`` module.

The names are collected from the ``hrm_deploy/engines`` modules that touch TensorRT (those
using ``backend.trt``; ``layers.py`` and ``build.py`` only read JSON) and from
``hrm_deploy/backends/tensorrt/api.py`` (which both builders and runners use) by an AST scan: ``trt.X`` and
``trt.X.Y`` (``trt`` being ``backend.trt`` / ``self.trt``), ``trt.X(...).m``, and attributes of
variables that hold a TensorRT object (``builder``, ``config``, ``engine``, ...: the table below
maps each to its class), plus the few names the code reaches through ``getattr`` strings. A
renamed or removed RTX API fails here on CPU, before anyone runs an engine.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[3] / "hrm_deploy"
CODE = sorted((PACKAGE / "backends" / "tensorrt").rglob("*.py"))
MODULE_ALIASES = {"trt", "backend.trt", "self.trt"}
# variable (or dotted attribute) -> tensorrt_rtx class, per file where the meaning differs
RECEIVERS = {
    "*": {
        "builder": "Builder",
        "network": "INetworkDefinition",
        "parser": "OnnxParser",
        "profile": "IOptimizationProfile",
        "engine": "ICudaEngine",
        "context": "IExecutionContext",
        "inspector": "EngineInspector",
        "layer": "ILayer",
        "runtime_config": "IRuntimeConfig",
        "e": "ParserError",
    },
    "worker.py": {"config": "IBuilderConfig", "cache": "ITimingCache"},
    "api.py": {"config": "IBuilderConfig", "self.cache": "IRuntimeCache", "handle.cache": "IRuntimeCache"},
}
# reached through getattr(...) with a string, so no AST attribute node names them
DYNAMIC = {
    ("Runtime", "get_engine_validity"),
    ("NetworkDefinitionCreationFlag", "STRONGLY_TYPED"),
    ("EngineValidity", "VALID"),
    ("EngineValidity", "SUBOPTIMAL"),
    ("EngineValidity", "INVALID"),
    ("", "EngineInvalidityDiagnostics"),
    ("ParserError", "node_name"),
    ("ParserError", "node_operator"),
    ("", "IProgressMonitor"),
    ("DynamicShapesKernelSpecializationStrategy", "EAGER"),
    ("CudaGraphStrategy", "WHOLE_GRAPH_CAPTURE"),
    ("BuilderFlag", "REQUIRE_USER_ALLOCATION"),
    ("IRuntimeConfig", "cuda_graph_strategy"),
    ("IRuntimeConfig", "dynamic_shapes_kernel_specialization_strategy"),
}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def used_names(source: str, filename: str) -> set[tuple[str, str]]:
    """{(class or "" for the module, attribute)} the source uses on TensorRT objects."""
    receivers = {**RECEIVERS["*"], **RECEIVERS.get(filename, {})}
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or node.attr.startswith("__"):
            continue
        value = node.value
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and _dotted(value.func.value) in MODULE_ALIASES
        ):
            found.add((value.func.attr, node.attr))  # trt.Runtime(logger).deserialize_cuda_engine
            continue
        owner = _dotted(value)
        if owner is None:
            continue
        if owner in MODULE_ALIASES:
            found.add(("", node.attr))  # trt.Builder
        elif "." in owner and owner.rsplit(".", 1)[0] in MODULE_ALIASES:
            found.add((owner.rsplit(".", 1)[1], node.attr))  # trt.Logger.WARNING
        elif owner in receivers:
            found.add((receivers[owner], node.attr))  # config.set_timing_cache
    return found


def all_used_names() -> set[tuple[str, str]]:
    names = set(DYNAMIC)
    for path in CODE:
        text = path.read_text()
        if "backend.trt" in text or "self.trt" in text:  # the modules that touch TensorRT objects
            names |= used_names(text, path.name)
    return names


def missing_on(module, names: set[tuple[str, str]]) -> list[str]:
    missing = []
    for cls, attr in sorted(names):
        owner = module if not cls else getattr(module, cls, None)
        if owner is None or not hasattr(owner, attr):
            missing.append(f"{cls + '.' if cls else ''}{attr}")
    return missing


def test_the_scan_finds_the_rtx_path_names():
    names = all_used_names()
    for expected in [
        ("", "Builder"),
        ("", "ProfilingVerbosity"),
        ("ProfilingVerbosity", "DETAILED"),
        ("IBuilderConfig", "profiling_verbosity"),
        ("IBuilderConfig", "set_compute_capability"),
        ("IBuilderConfig", "set_timing_cache"),
        ("Runtime", "deserialize_cuda_engine"),
        ("EngineInspector", "execution_context"),
        ("IExecutionContext", "set_input_shape"),
        ("ICudaEngine", "create_runtime_config"),
        ("IRuntimeConfig", "create_runtime_cache"),
        ("IRuntimeConfig", "set_runtime_cache"),
        ("IRuntimeCache", "deserialize"),
        ("IRuntimeCache", "serialize"),
        ("", "ComputeCapability"),
    ]:
        assert expected in names, expected


def test_a_missing_name_is_reported():
    fake = type("FakeModule", (), {"Builder": object, "IBuilderConfig": type("C", (), {"set_flag": None})})
    names = used_names(
        "def f(backend, config):\n    trt = backend.trt\n    trt.Builder\n    trt.NoSuchClass\n"
        "    config.set_flag(1)\n    config.set_runtime_cachez(None)\n",
        "worker.py",
    )
    assert missing_on(fake, names) == ["NoSuchClass", "IBuilderConfig.set_runtime_cachez"]


def test_installed_tensorrt_rtx_has_every_name_the_engine_code_uses():
    rtx = pytest.importorskip("tensorrt_rtx", reason="tensorrt-rtx is not installed (pip install 'hrm-deploy[rtx]')")
    assert missing_on(rtx, all_used_names()) == []
