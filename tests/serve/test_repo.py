"""triton-repo: generated repositories, checked without a server (every config.pbtxt parses as
a Triton ModelConfig with tritonclient's protobuf; I/O from the manifests)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from hrm_deploy.errors import ArtifactError, ConfigError
from hrm_deploy.manifest import write_manifest
from hrm_deploy.serve.repo import (
    Device,
    OnnxBackend,
    RepoBatching,
    RepoConfig,
    model_name,
    write_triton_repo,
)

if os.environ.get("HRM_REQUIRE_SERVE") == "1":  # CI: these must run, never skip
    from tritonclient.grpc import model_config_pb2
model_config_pb2 = pytest.importorskip(
    "tritonclient.grpc.model_config_pb2", reason="tritonclient not installed (pip install 'hrm-deploy[serve]')"
)
text_format = pytest.importorskip(
    "google.protobuf.text_format", reason="protobuf is not installed (pip install 'hrm-deploy[serve]')"
)


def parse(folder: Path):
    config = model_config_pb2.ModelConfig()
    text_format.Parse((folder / "config.pbtxt").read_text(), config)
    return config


def dims(tensor) -> list[int]:
    return list(tensor.dims)


def fake_engine(onnx: Path, folder: Path, backend: str = "tensorrt", max_batch: int = 32) -> Path:
    """An engine file + manifest as build-engine writes them (the bytes cannot be built here:
    standard TensorRT does not install on this machine); the parent is the real ONNX."""
    engine = folder / f"{onnx.stem}.datacenter.{backend}.engine"
    engine.write_bytes(b"not a real plan")
    meta = json.loads(Path(str(onnx) + ".manifest.json").read_text())
    shapes = {"inputs": [[1, 81], [8, 81], [max_batch, 81]], "puzzle_identifiers": [[1], [8], [max_batch]]}
    write_manifest(
        engine,
        stage="engine",
        config={},
        parent=onnx,
        mode=meta["mode"],
        steps=1,
        profile_shapes=shapes,
        backend={"name": backend, "version": "10.3"},
        target={"name": "datacenter"},
        precision="fp16",
    )
    return engine


def test_onnx_unrolled_repo_matches_manifest(tiny_onnx, tmp_path):
    out = tmp_path / "repo"
    models = write_triton_repo([tiny_onnx.unrolled], RepoConfig(output=out, instances=2, queue_delay_us=500))
    assert [(m.name, m.kind) for m in models] == [("tiny", "onnxruntime")]
    config = parse(out / "tiny")
    assert config.backend == "onnxruntime" and config.max_batch_size == 64  # export's max_batch
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(config.dynamic_batching.preferred_batch_size) == [16, 32, 64]
    assert [(g.count, g.kind) for g in config.instance_group] == [(2, model_config_pb2.ModelInstanceGroup.KIND_CPU)]
    io = json.loads((out / "tiny" / "tiny.onnx.manifest.json").read_text())["io"]
    assert {t.name for t in config.input} == set(io["inputs"]) and {t.name for t in config.output} == set(io["outputs"])
    by_name = {t.name: t for t in list(config.input) + list(config.output)}
    assert dims(by_name["inputs"]) == [81] and by_name["inputs"].data_type == model_config_pb2.TYPE_INT32
    assert dims(by_name["logits"]) == [81, 11] and by_name["logits"].data_type == model_config_pb2.TYPE_FP32
    assert dims(by_name["puzzle_identifiers"]) == [1] and list(by_name["puzzle_identifiers"].reshape.shape) == []
    assert (out / "tiny" / "1" / "model.onnx").read_bytes() == Path(tiny_onnx.unrolled).read_bytes()


def test_onnx_gpu_with_tensorrt_accelerator(tiny_onnx, tmp_path):
    out = tmp_path / "repo"
    write_triton_repo(
        [tiny_onnx.unrolled],
        RepoConfig(output=out, device=Device.gpu, trt_accelerator="fp16", max_batch=16, names=("sudoku",)),
    )
    config = parse(out / "sudoku")
    assert config.name == "sudoku" and config.max_batch_size == 16
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    accel = config.optimization.execution_accelerators.gpu_execution_accelerator[0]
    assert accel.name == "tensorrt" and accel.parameters["precision_mode"] == "FP16"


def test_step_graph_gets_act_driver(tiny_onnx, tmp_path):
    """With a halting rule the driver is in-flight (Triton's iterative sequences, one puzzle per
    request, candidates = max batch, the START control for a puzzle's first step); --batching dynamic
    or --halt off keep the per-batch driver behind the dynamic batcher."""
    out = tmp_path / "repo"
    models = write_triton_repo([tiny_onnx.step], RepoConfig(output=out, halt="threshold:0.5", names=("sudoku",)))
    assert [(m.name, m.kind) for m in models] == [("sudoku_step", "onnxruntime"), ("sudoku", "act-inflight")]
    step, driver = parse(out / "sudoku_step"), parse(out / "sudoku")
    by_name = {t.name: t for t in step.input}
    assert dims(by_name["z_H"]) == [82, 64] and by_name["reset"].data_type == model_config_pb2.TYPE_BOOL
    assert driver.backend == "python" and driver.max_batch_size == step.max_batch_size == 64
    assert not driver.HasField("dynamic_batching") and driver.sequence_batching.iterative_sequence
    assert driver.sequence_batching.oldest.max_candidate_sequences == 64
    assert driver.sequence_batching.oldest.max_queue_delay_microseconds == 0
    (control,) = driver.sequence_batching.control_input
    assert control.name == "START" and list(control.control[0].int32_false_true) == [0, 1]
    params = {k: v.string_value for k, v in driver.parameters.items()}
    assert params == {
        "step_model": "sudoku_step",
        "step_inputs": "inputs,puzzle_identifiers,z_H,z_L,reset",
        "step_outputs": "z_H_out,z_L_out,logits,q_halt_logits,q_continue_logits",
        "steps": "1",
        "carry_len": "82",
        "hidden_size": "64",
        "vocab_size": "11",
        "num_puzzle_identifiers": "1",
        "halt": "threshold:0.5",
        "schedule": "inflight",
        "max_live": "64",
    }
    assert [t.name for t in driver.output] == ["answer", "logits", "q_halt_logits", "steps"]
    source = (out / "sudoku" / "1" / "model.py").read_text()
    assert "class TritonPythonModel" in source and "import hrm_deploy" not in source
    compile(source, "model.py", "exec")
    assert (out / "sudoku" / "tiny.step.onnx.manifest.json").is_file()
    for config in (
        RepoConfig(output=tmp_path / "d", halt="q", batching=RepoBatching.dynamic),
        RepoConfig(output=tmp_path / "o"),  # --halt off
        RepoConfig(output=tmp_path / "v", halt="q", triton_version="23.10"),  # before rescheduling
    ):
        models = write_triton_repo([tiny_onnx.step], config)
        assert models[1].kind == "act-driver", config
        driver = parse(config.output / "tiny_step")
        assert driver.HasField("dynamic_batching") and not driver.HasField("sequence_batching")
        assert {k: v.string_value for k, v in driver.parameters.items()}["schedule"] == "batch"
    assert "cannot run the in-flight ACT driver" in (models[1].note or "")
    with pytest.raises(ConfigError, match="--batching inflight: Triton 2.39 cannot run the in-flight ACT driver"):
        write_triton_repo(
            [tiny_onnx.step],
            RepoConfig(output=tmp_path / "x", halt="q", batching=RepoBatching.inflight, triton_version="2.39"),
        )
    with pytest.raises(ConfigError, match="--triton-version 'latest'"):
        write_triton_repo([tiny_onnx.step], RepoConfig(output=tmp_path / "y", halt="q", triton_version="latest"))


def test_engine_repo_structural(tiny_onnx, tmp_path):
    engine = fake_engine(Path(tiny_onnx.unrolled), tmp_path, max_batch=32)
    out = tmp_path / "repo"
    write_triton_repo([engine, tiny_onnx.unrolled], RepoConfig(output=out, names=("trt", "ort")))
    config = parse(out / "trt")
    assert config.platform == "tensorrt_plan" and config.max_batch_size == 32  # the profile's max
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_GPU
    assert (out / "trt" / "1" / "model.plan").read_bytes() == b"not a real plan"
    assert (out / "trt" / engine.name.replace(".engine", ".engine.manifest.json")).is_file()
    assert parse(out / "ort").backend == "onnxruntime"
    with pytest.raises(ConfigError, match="give 1..32, the largest batch"):
        write_triton_repo([engine], RepoConfig(output=tmp_path / "r2", max_batch=64))


def test_engine_from_precision_graph_reads_the_export_manifest(tiny_onnx, tmp_path):
    """engine -> fp16 graph (manifest without I/O) -> FP32 export: the I/O comes from the export."""
    from hrm_deploy.runtime.artifact import read_contract

    fp16 = tmp_path / "tiny.fp16.onnx"
    shutil.copyfile(tiny_onnx.unrolled, fp16)
    write_manifest(
        fp16, stage="precision-fp16", config={"precision": "fp16"}, parent=tiny_onnx.unrolled, mode="unrolled", steps=1
    )
    contract = read_contract(fake_engine(fp16, tmp_path, max_batch=8))
    assert contract.kind == "engine" and contract.max_batch == 8 and contract.target == "datacenter"
    assert contract.seq_len == 81 and contract.vocab_size == 11 and contract.steps == 1
    assert set(contract.io["outputs"]) == {"logits", "q_halt_logits", "q_continue_logits"}
    assert read_contract(fp16).max_batch == 64
    export_manifest = Path(str(tiny_onnx.unrolled) + ".manifest.json")
    export_manifest.rename(tmp_path / "moved.json")
    try:
        with pytest.raises(ArtifactError, match="or its manifest is missing"):
            read_contract(fp16)
    finally:
        (tmp_path / "moved.json").rename(export_manifest)


def test_refusals(tiny_onnx, trained_tiny, tmp_path):
    rtx = fake_engine(Path(tiny_onnx.unrolled), tmp_path, backend="tensorrt-rtx")
    with pytest.raises(ArtifactError, match="tensorrt_plan backend runs standard TensorRT"):
        write_triton_repo([rtx], RepoConfig(output=tmp_path / "a"))
    with pytest.raises(ArtifactError, match="export it first"):
        write_triton_repo([trained_tiny.checkpoint], RepoConfig(output=tmp_path / "b"))
    with pytest.raises(ConfigError, match="--halt"):
        write_triton_repo([tiny_onnx.step], RepoConfig(output=tmp_path / "c", halt="sometimes"))
    with pytest.raises(ConfigError, match="needs --device gpu"):
        write_triton_repo([tiny_onnx.unrolled], RepoConfig(output=tmp_path / "d", trt_accelerator="fp16"))
    lone = tmp_path / "lone.onnx"
    shutil.copyfile(tiny_onnx.unrolled, lone)
    with pytest.raises(ArtifactError, match="no manifest"):
        write_triton_repo([lone], RepoConfig(output=tmp_path / "e"))
    full = tmp_path / "full"
    (full / "x").mkdir(parents=True)
    with pytest.raises(ConfigError, match="not empty"):
        write_triton_repo([tiny_onnx.unrolled], RepoConfig(output=full))
    assert (full / "x").is_dir()  # nothing replaced
    with pytest.raises(ConfigError, match="replaces only a repository hrm-deploy wrote"):
        write_triton_repo([tiny_onnx.unrolled], RepoConfig(output=full, overwrite=True))
    assert (full / "x").is_dir()  # a folder of someone else's is never replaced
    ours = tmp_path / "ours"
    write_triton_repo([tiny_onnx.unrolled], RepoConfig(output=ours))
    write_triton_repo([tiny_onnx.unrolled], RepoConfig(output=ours, overwrite=True, names=("again",)))
    assert not (ours / "tiny").exists() and (ours / "again" / "config.pbtxt").is_file()


def test_python_ort_backend_and_names(tiny_onnx, tmp_path):
    out = tmp_path / "repo"
    write_triton_repo([tiny_onnx.unrolled, tiny_onnx.step], RepoConfig(output=out, onnx_backend=OnnxBackend.python))
    assert parse(out / "tiny").backend == "python" and (out / "tiny" / "1" / "model.py").is_file()
    assert parse(out / "tiny_step_step").backend == "python" and parse(out / "tiny_step").backend == "python"
    assert model_name(Path("a/sudoku-tiny.fp16.onnx")) == "sudoku-tiny_fp16"


def test_cli_triton_repo(tiny_onnx, tmp_path):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    out = tmp_path / "repo"
    result = CliRunner().invoke(app, ["triton-repo", str(tiny_onnx.unrolled), "-o", str(out), "--max-batch", "8"])
    assert result.exit_code == 0, result.output
    assert parse(out / "tiny").max_batch_size == 8
    result = CliRunner().invoke(app, ["triton-repo", str(tiny_onnx.unrolled), "-o", str(out)])
    assert result.exit_code == 2 and "not empty" in result.output


def test_the_serve_hint_works_as_printed(tiny_onnx, tmp_path):
    """A repository path with a space and a quote: the printed command line, split as a shell would,
    names exactly that folder."""
    import shlex

    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    repo = tmp_path / "my repo's"
    result = CliRunner().invoke(app, ["triton-repo", str(tiny_onnx.unrolled), "-o", str(repo)])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if "serve it with:" in x)
    argv = shlex.split(line.split("serve it with:", 1)[1])
    assert argv == ["tritonserver", "--model-repository", str(repo)]


def test_kserve_manifest_validates_offline(tiny_onnx, tmp_path):
    """`--kserve` writes a ServingRuntime and an InferenceService: every Kubernetes object in them (the
    runtime's container, the predictor's resources, the metadata) validates against the Kubernetes
    schema (kubernetes-validate, strict: no unknown field), and the KServe fields against the fields
    of KServe's v1alpha1 ServingRuntime / v1beta1 InferenceService CRDs that it uses (transcribed
    below: the kserve SDK needs python-dateutil<3, which this environment does not have)."""
    if os.environ.get("HRM_REQUIRE_SERVE") != "1":
        pytest.importorskip(
            "kubernetes_validate", reason="kubernetes-validate not installed (pip install 'hrm-deploy[serve]')"
        )
    import jsonschema
    import kubernetes_validate
    import yaml

    out = tmp_path / "repo"
    write_triton_repo([tiny_onnx.step], RepoConfig(output=out, halt="q", names=("Sudoku_small",), kserve=True))
    text = (out / "kserve.yaml").read_text()
    assert "kubectl apply -f kserve.yaml" in text
    runtime, service = yaml.safe_load_all(text)

    def k8s(kind: str, spec: dict) -> None:
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": kind, "metadata": {"name": "x"}, **spec}, "1.30", strict=True
        )

    for obj in (runtime, service):
        k8s("Pod", {"metadata": obj["metadata"], "spec": {"containers": [{"name": "c", "image": "i"}]}})
    k8s("Pod", {"spec": {"containers": runtime["spec"]["containers"]}})
    model = service["spec"]["predictor"]["model"]
    k8s("Pod", {"spec": {"containers": [{"name": "kserve-container", "resources": model["resources"]}]}})

    def obj(properties: dict, required: tuple[str, ...] = ()) -> dict:
        return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}

    text_ = {"type": "string"}
    model_format = obj({"name": text_, "version": text_, "autoSelect": {"type": "boolean"}}, ("name",))
    kserve = {
        "ServingRuntime": obj(
            {
                "apiVersion": {"const": "serving.kserve.io/v1alpha1"},
                "kind": {"const": "ServingRuntime"},
                "metadata": {"type": "object"},
                "spec": obj(
                    {
                        "annotations": {"type": "object", "additionalProperties": text_},
                        "supportedModelFormats": {"type": "array", "items": model_format},
                        "protocolVersions": {"type": "array", "items": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]}},
                        "containers": {"type": "array", "minItems": 1},
                    },
                    ("containers",),
                ),
            },
            ("apiVersion", "kind", "metadata", "spec"),
        ),
        "InferenceService": obj(
            {
                "apiVersion": {"const": "serving.kserve.io/v1beta1"},
                "kind": {"const": "InferenceService"},
                "metadata": {"type": "object"},
                "spec": obj(
                    {
                        "predictor": obj(
                            {
                                "model": obj(
                                    {
                                        "modelFormat": model_format,
                                        "runtime": text_,
                                        "protocolVersion": {"enum": ["v1", "v2", "grpc-v1", "grpc-v2"]},
                                        "storageUri": text_,
                                        "resources": {"type": "object"},
                                    },
                                    ("modelFormat",),
                                )
                            },
                            ("model",),
                        )
                    },
                    ("predictor",),
                ),
            },
            ("apiVersion", "kind", "metadata", "spec"),
        ),
    }
    for item in (runtime, service):
        jsonschema.validate(item, kserve[item["kind"]])
    assert model["runtime"] == runtime["metadata"]["name"] and service["metadata"]["name"] == "sudoku-small"
    assert runtime["spec"]["supportedModelFormats"][0]["name"] == model["modelFormat"]["name"] == "triton"
    assert "nvidia.com/gpu" not in model["resources"]["limits"]  # a CPU repository asks for no GPU
    assert "--model-store=/mnt/models" in runtime["spec"]["containers"][0]["args"]
    bad = {**service, "spec": {"predictor": {"model": {**model, "storageURI": "x"}}}}  # a misspelt field fails
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, kserve["InferenceService"])
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s("Pod", {"spec": {"containers": [{"name": "c", "resources": {"limit": {"cpu": "1"}}}]}})
    # the repository still serves: Triton skips files at its top level, --overwrite replaces it
    write_triton_repo([tiny_onnx.step], RepoConfig(output=out, halt="q", overwrite=True))
    assert not (out / "kserve.yaml").exists()


def test_engines_ask_kserve_for_a_gpu_and_versions_map_to_ngc_images(tiny_onnx, tmp_path):
    import yaml

    from hrm_deploy.serve.repo import ngc_release, triton_version

    assert triton_version("24.10") == (2, 51) == triton_version("2.51.0") and ngc_release((2, 51)) == "24.10"
    assert triton_version("23.12") == (2, 41) and ngc_release((2, 40)) == "23.11"
    engine = fake_engine(Path(tiny_onnx.unrolled), tmp_path, max_batch=8)
    out = tmp_path / "repo"
    write_triton_repo([engine], RepoConfig(output=out, kserve=True, triton_version="2.50"))
    runtime, service = yaml.safe_load_all((out / "kserve.yaml").read_text())
    assert runtime["spec"]["containers"][0]["image"] == "nvcr.io/nvidia/tritonserver:24.09-py3"
    assert service["spec"]["predictor"]["model"]["resources"]["limits"]["nvidia.com/gpu"] == "1"
