"""Real TensorRT-RTX builds on CPU from the trained tiny fixture (parse + build + manifest)."""

import json
import shlex
import sys

import onnx
import pytest
from onnx import TensorProto, helper

from hrm_deploy.backends.tensorrt.api import load_backend
from hrm_deploy.backends.tensorrt.builder.engine import layers_path
from hrm_deploy.backends.tensorrt.builder.options import TensorRTOptions
from hrm_deploy.engines.build import EngineConfig, build_engine, newest_export
from hrm_deploy.engines.targets import TARGETS, get_target
from hrm_deploy.errors import ArtifactError, ConfigError, DependencyError, EngineError
from hrm_deploy.manifest import write_manifest

try:
    load_backend("tensorrt-rtx")
    HAVE_RTX = True
except DependencyError:
    HAVE_RTX = False
rtx = pytest.mark.skipif(not HAVE_RTX, reason="tensorrt-rtx is not installed (pip install 'hrm-deploy[rtx]')")


@pytest.mark.slow
@rtx
@pytest.mark.trt
@pytest.mark.parametrize("precision,dtype_key", [("fp16", "HALF"), ("int8", None), ("bf16", "BF16")])
def test_rtx_builds_engines_from_the_trained_fixture(tiny_onnx, tmp_path, monkeypatch, precision, dtype_key):
    monkeypatch.chdir(tmp_path)  # calib/ and engines/ workspaces
    stale = layers_path(tmp_path / f"m.{precision}.engine")
    stale.write_text('{"Layers": ["from an older engine"]}')
    older = tmp_path / f"m.{precision}.engine"  # the older engine of ours these layers belong to
    older.write_bytes(b"an older engine")
    write_manifest(older, stage="engine", config={}, layers_json=stale.name)
    result = build_engine(
        tiny_onnx.unrolled,
        EngineConfig(precision, calib_data=tiny_onnx.data, calib_samples=64, max_batch=16),
        out=tmp_path / f"m.{precision}.engine",
        quiet=True,
    )
    assert result.path.stat().st_size > 100_000
    manifest = json.loads(result.manifest.read_text())
    assert manifest["backend"]["name"] == "tensorrt-rtx" and manifest["compute_capability"] == "SM120"
    assert manifest["precision"] == precision and manifest["profile_shapes"]["inputs"][2] == [16, 81]
    assert manifest["onnx_sha256"] and manifest["build"]["build_seconds"] > 0
    assert manifest["graph_rewrites"]["slices_to_gathers"] > 0
    network = manifest["build"]["network"]
    # static slices are parsed as gathers (the TensorRT builder's _for_tensorrt): the parser no longer rebuilds each
    # one's bounds from the run-time shape; INT64 was 2/3 of the layers, the embedding's expand is left
    assert network["output_dtypes"].get("INT64", 0) < 0.2 * network["layers"]
    if precision == "fp16":  # the memory plan of what RTX built: the engine file's size, against the graph's weights
        from hrm_deploy.engines.plan import memory_plan

        engine_plan, graph_plan = memory_plan(result.path), memory_plan(tiny_onnx.unrolled, precision="fp16")
        assert engine_plan.weights == result.path.stat().st_size and engine_plan.weights_from == "engine file"
        assert 0 < graph_plan.weights <= engine_plan.weights  # the plan holds the weights (and kernels besides)
    if dtype_key:
        assert network["output_dtypes"].get(dtype_key)
    else:
        assert network["qdq_layers"] > 0 and manifest["calibration_key"]
    # the same build with NVIDIA's tool, and the inspector's layers where a GPU could load the engine
    command = shlex.split(manifest["trtexec_command"])
    assert command[0] == "tensorrt_rtx" and f"--saveEngine={result.path}" in command
    assert "--computeCapabilities=120" in command and "--profilingVerbosity=detailed" in command
    assert "--minShapes=inputs:1x81,puzzle_identifiers:1" in command and "--memPoolSize=workspace:4096M" in command
    inspection = manifest["build"]["engine_inspection"]
    if inspection["available"]:  # a GPU loaded it: the layers sit beside the engine, trex-readable
        assert manifest["layers_json"] == stale.name and isinstance(json.loads(stale.read_text())["Layers"][0], dict)
        assert inspection["verdict"] in ("took", "cannot_tell")
    else:  # CPU-only: RTX builds AOT without a GPU but cannot load the engine to inspect it
        assert inspection["reason"] and manifest["layers_json"] is None and not stale.exists()


@pytest.mark.slow
@rtx
@pytest.mark.trt
def test_rtx_builds_the_single_step_engine(tiny_onnx, tmp_path):
    result = build_engine(
        tiny_onnx.step,
        EngineConfig("fp16", options=TensorRTOptions(timing_cache=None)),
        out=tmp_path / "s.engine",
        quiet=True,
    )
    manifest = json.loads(result.manifest.read_text())
    assert manifest["timing_cache"] is None and "--timingCacheFile" not in manifest["trtexec_command"]
    assert manifest["mode"] == "step" and set(manifest["profile_shapes"]) == {
        "inputs",
        "puzzle_identifiers",
        "z_H",
        "z_L",
        "reset",
    }


@rtx
@pytest.mark.trt
def test_parser_errors_name_the_node(tmp_path):
    node = helper.make_node("NoSuchOp", ["x"], ["y"], name="broken_node", domain="custom.domain")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("custom.domain", 1)]
    )
    model.metadata_props.add(key="hrm_deploy.mode", value="unrolled")
    onnx.save(model, tmp_path / "bad.onnx")
    with pytest.raises(EngineError, match="broken_node"):
        build_engine(
            tmp_path / "bad.onnx",
            EngineConfig("fp32", options=TensorRTOptions(timing_cache=None)),
            out=tmp_path / "bad.engine",
            quiet=True,
        )
    assert not (tmp_path / "bad.engine").exists()


@rtx
def test_jetson_memory_budget_is_checked_before_building(tiny_onnx, tmp_path, monkeypatch):
    import hrm_deploy.backends.tensorrt.builder.engine as trt_build
    import hrm_deploy.engines.build as build
    import hrm_deploy.engines.plan as trt_plan

    monkeypatch.setattr(trt_plan, "BUILD_MIB_PER_NODE", 100.0)  # as if the graph were a full 16-step unroll
    monkeypatch.setattr(trt_build, "load_backend", lambda name: load_backend("tensorrt-rtx"))  # no JetPack TRT here
    with pytest.raises(EngineError, match="--mode step"):
        build.build_engine(
            tiny_onnx.unrolled,
            EngineConfig("fp32", target="jetson-orin-8gb", backend="tensorrt"),
            out=tmp_path / "j.engine",
            quiet=True,
        )


def test_targets_are_data_and_bad_choices_are_clear():
    assert get_target("jetson-orin-8gb").default_mode == "step" and TARGETS["desktop"].compute_capability == "SM120"
    with pytest.raises(ConfigError, match="unknown target"):
        get_target("xbox")
    with pytest.raises(ConfigError, match="precision"):
        EngineConfig("int4")


def test_missing_backend_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import fails as on a machine without it
    from hrm_deploy.errors import install_hint

    with pytest.raises(DependencyError) as error:  # this installation's command (a checkout: pip install -e)
        load_backend("tensorrt")
    assert install_hint("trt") in str(error.value)


def test_no_export_is_one_clear_error(tmp_path):
    with pytest.raises(ArtifactError, match="hrm-deploy export"):
        newest_export(tmp_path)
