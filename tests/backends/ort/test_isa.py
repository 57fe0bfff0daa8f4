"""Static INT8's integer GEMM choice (U8S8 or S8S8): measured at build, recorded, same values either way."""

from __future__ import annotations

import numpy as np
import pytest

from hrm_deploy.backends.ort.builder.isa import ISA_FLAGS, choose_activations, isa_flags, qdq_matmul_graph
from hrm_deploy.errors import ConfigError


def test_an_explicit_choice_is_taken_as_given():
    record = choose_activations("uint8", 8, 16, 32, 1)
    assert record["activations"] == "uint8" and "u8s8_ms" not in record
    assert set(record["isa"]) <= set(ISA_FLAGS)


def test_auto_times_both_gemms_and_records_why():
    record = choose_activations("auto", 16, 64, 128, 1)
    assert record["activations"] in ("uint8", "int8")
    assert record["u8s8_ms"] > 0 and record["s8s8_ms"] > 0
    assert "[16x64] @ [64x128]" in record["chosen_by"]
    faster = "int8" if record["s8s8_ms"] < 0.95 * record["u8s8_ms"] else "uint8"
    assert record["activations"] == faster
    assert record["isa"] == isa_flags()


def test_u8s8_and_s8s8_graphs_compute_the_same_values():
    """Same symmetric ranges: uint8 with zero point 128 and int8 with zero point 0 hold the same
    quantized values, so the choice changes speed, never answers."""
    from hrm_deploy.onnx_runtime import ort_session

    x = np.random.default_rng(3).standard_normal((8, 32)).astype(np.float32)
    outs = [ort_session(qdq_matmul_graph(8, 32, 16, a), threads=1).run(None, {"x": x})[0] for a in ("uint8", "int8")]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_unknown_activation_type_refused():
    from hrm_deploy.backends.ort.builder.cpu import CpuBuildConfig

    with pytest.raises(ConfigError, match="activations are one of auto, uint8, int8"):
        CpuBuildConfig("int8", activations="int4")


@pytest.mark.slow
@pytest.mark.parametrize("activations", ["uint8", "int8"])
def test_static_graph_of_either_gemm_is_batch_independent(tiny_onnx, tmp_path, activations):
    """U8S8 and S8S8 static graphs: every puzzle's logits bit-identical alone and in a batch of 64;
    the two graphs agree with each other (same quantized values)."""
    import json

    from hrm_deploy.backends import open_runner
    from hrm_deploy.backends.ort.builder.cpu import CpuBuildConfig, build_cpu
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.runtime.infer import predict

    config = CpuBuildConfig(
        "int8",
        threads=1,
        calib_data=tiny_onnx.data,
        calib_samples=32,
        check_accuracy=False,
        cache_dir=str(tmp_path / "calib"),
        activations=activations,
    )
    built = build_cpu(tiny_onnx.unrolled, config, tmp_path / f"{activations}.int8.cpu.ort.onnx", quiet=True)
    recipe = json.loads(built.manifest.read_text())["recipe"]
    assert recipe["activations"]["activations"] == activations
    assert built.build["op_types"]["com.microsoft.MatMulIntegerToFloat"] == built.build["quantized_nodes"]
    examples = load_examples(tiny_onnx.data, 100, split="test")
    with open_runner(built.path, threads=1) as runner:
        alone, batched = predict(runner, examples, batch=1), predict(runner, examples, batch=64)
    assert np.array_equal(alone, batched)
