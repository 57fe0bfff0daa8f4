"""Static INT8's integer GEMM (U8S8 or S8S8): chosen from the CPU's ISA or by the caller, never by a
stopwatch; recorded; the same quantized values either way."""

from __future__ import annotations

import numpy as np
import pytest

from hrm_deploy.backends.ort.builder.isa import (
    ISA_FLAGS,
    activations_for,
    choose_activations,
    isa_flags,
    qdq_matmul_graph,
)
from hrm_deploy.errors import ConfigError


def test_the_isa_decides_and_the_record_says_why():
    assert activations_for(["amx_int8", "avx512_vnni", "avx2"])[0] == "int8"
    assert activations_for(["avx512_vnni", "avx512f", "avx2"])[0] == "uint8"
    assert activations_for(["avx_vnni", "avx2"])[0] == "uint8"
    assert activations_for(["avx2"])[0] == "uint8"
    record = choose_activations("auto", "unrolled")
    assert record["activations"] == activations_for(isa_flags())[0] and record["isa"] == isa_flags()
    assert record["chosen_by"].startswith("this CPU's ISA") and set(record["isa"]) <= set(ISA_FLAGS)
    assert choose_activations("auto", "unrolled") == record  # no clock: the same answer every time


def test_an_explicit_choice_is_taken_as_given_and_a_loop_graph_takes_uint8():
    assert choose_activations("int8", "step")["activations"] == "int8"
    assert choose_activations("auto", "loop")["activations"] == "uint8"
    with pytest.raises(ConfigError, match="int8 activations of a loop graph are not offered"):
        choose_activations("int8", "loop")


def test_u8s8_and_s8s8_graphs_compute_the_same_values():
    """Same symmetric ranges: uint8 with zero point 128 and int8 with zero point 0 hold the same
    quantized values, so the choice changes speed, never answers."""
    from hrm_deploy.onnx_runtime import ort_session

    x = np.random.default_rng(3).standard_normal((8, 32)).astype(np.float32)
    outs = [ort_session(qdq_matmul_graph(8, 32, 16, a), threads=1).run(None, {"x": x})[0] for a in ("uint8", "int8")]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_unknown_activation_type_refused():
    from hrm_deploy.backends.ort.builder.options import CpuOptions
    from hrm_deploy.engines.config import EngineConfig

    with pytest.raises(ConfigError, match="activations are one of auto, uint8, int8"):
        EngineConfig("int8", target="cpu", options=CpuOptions(activations="int4"))


@pytest.mark.slow
@pytest.mark.parametrize("activations", ["uint8", "int8"])
def test_static_graph_of_either_gemm_is_batch_independent(tiny_onnx, tmp_path, activations):
    """U8S8 and S8S8 static graphs: every puzzle's logits bit-identical alone and in a batch of 64;
    the two graphs agree with each other (same quantized values)."""
    import json

    from hrm_deploy.backends import open_runner
    from hrm_deploy.backends.ort.builder.cpu import build_cpu
    from hrm_deploy.backends.ort.builder.options import CpuOptions
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.engines.config import EngineConfig
    from hrm_deploy.runtime.infer import predict

    config = EngineConfig(
        "int8",
        target="cpu",
        calib_data=tiny_onnx.data,
        calib_samples=32,
        accuracy_check=False,
        calib_cache=str(tmp_path / "calib"),
        options=CpuOptions(threads=1, activations=activations),
    )
    built = build_cpu(tiny_onnx.unrolled, config, tmp_path / f"{activations}.int8.cpu.ort.onnx", quiet=True)
    recipe = json.loads(built.manifest.read_text())["recipe"]
    assert recipe["activations"]["activations"] == activations
    assert built.build["op_types"]["com.microsoft.MatMulIntegerToFloat"] == built.build["quantized_nodes"]
    examples = load_examples(tiny_onnx.data, 100, split="test")
    with open_runner(built.path, threads=1) as runner:
        alone, batched = predict(runner, examples, batch=1), predict(runner, examples, batch=64)
    assert np.array_equal(alone, batched)
