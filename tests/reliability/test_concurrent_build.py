"""build-engine while an export replaces the same ONNX: the engine is built
from the bytes whose sha256 was checked, and its manifest records exactly those bytes."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess

import pytest

from hrm_deploy.backends.tensorrt.api import load_backend
from hrm_deploy.backends.tensorrt.builder.options import TensorRTOptions
from hrm_deploy.errors import DependencyError
from hrm_deploy.io import staging_dir
from hrm_deploy.manifest import manifest_path, publish_artifact, read_manifest

try:
    load_backend("tensorrt-rtx")
    HAVE_RTX = True
except DependencyError:
    HAVE_RTX = False


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_RTX, reason="tensorrt-rtx is not installed (pip install 'hrm-deploy[rtx]')")
@pytest.mark.trt
def test_export_replacing_the_graph_during_a_build(tiny_onnx, tmp_path, monkeypatch):
    import hrm_deploy.backends.tensorrt.builder.engine as trt_build
    import hrm_deploy.engines.build as build

    graph = tmp_path / "model.onnx"
    shutil.copy(tiny_onnx.step, graph)
    shutil.copy(manifest_path(tiny_onnx.step), manifest_path(graph))
    step_sha = hashlib.sha256(graph.read_bytes()).hexdigest()
    real_run = subprocess.run

    def export_lands_now(*args, **kwargs):
        if "hrm_deploy.backends.tensorrt.builder.worker" not in args[0]:  # other probes (nvidia-smi) run as they are
            return real_run(*args, **kwargs)
        # a concurrent `hrm-deploy export -o model.onnx` of the unrolled graph finishes as the builder starts
        with staging_dir(tmp_path, "export-check") as staging:
            staged = staging / graph.name
            shutil.copy(tiny_onnx.unrolled, staged)
            fields = {
                k: v
                for k, v in read_manifest(tiny_onnx.unrolled).items()
                if k not in ("sha256", "size_bytes", "artifact", "manifest_version", "parent")
            }
            publish_artifact(staged, graph, **fields)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(trt_build.subprocess, "run", export_lands_now)
    result = build.build_engine(
        graph,
        build.EngineConfig("fp32", options=TensorRTOptions(timing_cache=None)),
        out=tmp_path / "m.engine",
        quiet=True,
    )
    manifest = json.loads(result.manifest.read_text())
    assert manifest["onnx_sha256"] == step_sha == manifest["parent"]["sha256"]
    assert "z_H" in manifest["profile_shapes"]  # the step graph was built, as recorded
    assert hashlib.sha256(graph.read_bytes()).hexdigest() != step_sha  # the file on disk is the new export
