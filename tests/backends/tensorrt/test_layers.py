"""The post-build precision check fed engine-inspector JSON in the shapes TensorRT produces.

The layer dicts follow the field layouts TensorRT's inspector documents and trt-engine-explorer
parses (``Name``, ``LayerType``, ``Inputs``/``Outputs`` of ``{Name, Dimensions, Format/Datatype}``):
classic TensorRT 8.x-10.x format strings ("Row major linear FP16 format"), the bare data types
of compiler-generated kernels (TensorRT 10.x ``kgen``, TensorRT 11, TensorRT-RTX: "Half"),
``{ForeignNode[...]}`` Myelin subgraphs, and the names-only list of the default
``LAYER_NAMES_ONLY`` verbosity. Before the fix, every one but the bare-"Half" case was refused.
"""

import json

import pytest

from hrm_deploy.backends.tensorrt.builder.engine import _check_precision_took
from hrm_deploy.backends.tensorrt.builder.layers import precision_verdict, summarize_layers
from hrm_deploy.errors import EngineError


def tensor(name, fmt, dims=(8, 81, 64)):
    return {"Name": name, "Location": "Device", "Dimensions": list(dims), "Format/Datatype": fmt}


NAMES_ONLY = {
    "Layers": [
        "inputs_embedding",
        "{ForeignNode[/L_level/layers.0/Mul.../lm_head/MatMul]}",
        "Reformatting CopyNode for Output Tensor 0 to logits",
    ],
    "Bindings": ["inputs", "puzzle_identifiers", "logits"],
}

TRT10_FP16 = {
    "Layers": [
        {
            "Name": "lm_head/MatMul",
            "LayerType": "CaskGemmMatrixMultiply",
            "Inputs": [tensor("h", "Row major linear FP16 format")],
            "Outputs": [tensor("y", "Row major linear FP16 format")],
            "ParameterType": "MatrixMultiply",
            "TacticValue": "0x0",
        },
        {
            "Name": "rms_norm/Pow",
            "LayerType": "PointWiseV2",
            "Inputs": [tensor("a", "Row major linear FP32")],
            "Outputs": [tensor("b", "Row major linear FP32")],
            "ParameterType": "PointWise",
        },
        {
            "Name": "attn/Softmax",
            "LayerType": "CaskSoftMaxV2",
            "Inputs": [tensor("s", "Channel major FP16 format where channel % 8 == 0")],
            "Outputs": [tensor("p", "Channel major FP16 format where channel % 8 == 0")],
            "ParameterType": "SoftMax",
        },
    ],
    "Bindings": ["inputs", "logits"],
}

TRT10_BF16 = {
    "Layers": [
        {
            "Name": "mlp/MatMul",
            "LayerType": "CaskGemmMatrixMultiply",
            "Inputs": [tensor("h", "Row major linear BFloat16 format")],
            "Outputs": [tensor("y", "Row major linear FP32")],
        }
    ]
}

TRT10_INT8 = {
    "Layers": [
        {
            "Name": "mlp/MatMul + DQ",
            "LayerType": "CaskGemmMatrixMultiply",
            "Inputs": [tensor("q", "Row major INT8 format where column stride % 64 == 0")],
            "Outputs": [tensor("y", "Row major linear FP16 format")],
            "Weights": {"Type": "Int8", "Count": 4096},
        }
    ]
}

TRT11_FP16 = {
    "Layers": [
        {
            "Name": "__myl_MulAddCast",
            "LayerType": "kgen",
            "Inputs": [tensor("x", "Float")],
            "Outputs": [tensor("y", "Half")],
            "TacticName": "pointwise",
        },
        {
            "Name": "lm_head/MatMul",
            "LayerType": "gemm",
            "Inputs": [tensor("y", "Half")],
            "Outputs": [tensor("z", "Half")],
        },
    ]
}

TRT11_FP32 = {
    "Layers": [
        {
            "Name": "lm_head/MatMul",
            "LayerType": "gemm",
            "Inputs": [tensor("y", "Float")],
            "Outputs": [tensor("z", "Float")],
        },
        {
            "Name": "norm/Pow",
            "LayerType": "PointWiseV2",
            "Inputs": [tensor("a", "Float")],
            "Outputs": [tensor("b", "Float")],
        },
    ]
}

MYELIN_ONLY = {
    "Layers": [
        {
            "Name": "{ForeignNode[/embed/Gather.../lm_head/MatMul]}",
            "LayerType": "Myelin",
            "Inputs": [tensor("inputs", "Row major linear Int32", (8, 81))],
            "Outputs": [tensor("logits", "Row major linear FP32", (8, 81, 11))],
            "TacticValue": "0x0",
        },
        {
            "Name": "Reformatting CopyNode for Output Tensor 0",
            "LayerType": "NoOp",
            "Inputs": [tensor("logits", "Row major linear FP32")],
            "Outputs": [tensor("out", "Row major linear FP32")],
        },
    ]
}

NO_FORMATS = {
    "Layers": [  # DETAILED, but read without an execution context: formats are not shown
        {
            "Name": "lm_head/MatMul",
            "LayerType": "CaskGemmMatrixMultiply",
            "Inputs": [{"Name": "h", "Dimensions": [-1, 81, 64]}],
            "Outputs": [{"Name": "y", "Dimensions": [-1, 81, 11]}],
        }
    ]
}

NETWORK = {
    "fp16": {"output_dtypes": {"HALF": 40, "FLOAT": 12}, "qdq_layers": 0},
    "bf16": {"output_dtypes": {"BF16": 40, "FLOAT": 12}, "qdq_layers": 0},
    "int8": {"output_dtypes": {"INT8": 8, "FLOAT": 40}, "qdq_layers": 16},
}


def build_record(precision, inspector_json):
    """What the worker returns: the network summary plus the inspector summary of the JSON text."""
    return {
        "network": NETWORK[precision],
        "engine_inspection": {"available": True, "summary": summarize_layers(json.dumps(inspector_json))},
    }


@pytest.mark.parametrize(
    "precision,shape,verdict",
    [
        ("fp16", NAMES_ONLY, "cannot_tell"),
        ("fp16", TRT10_FP16, "took"),
        ("bf16", TRT10_BF16, "took"),
        ("int8", TRT10_INT8, "took"),
        ("fp16", TRT11_FP16, "took"),
        ("fp16", MYELIN_ONLY, "cannot_tell"),
        ("int8", MYELIN_ONLY, "cannot_tell"),
        ("fp16", NO_FORMATS, "cannot_tell"),
    ],
)
def test_reduced_precision_engines_are_accepted(precision, shape, verdict):
    build = build_record(precision, shape)
    assert _check_precision_took(precision, build) == verdict
    assert build["engine_inspection"]["verdict"] == verdict and build["engine_inspection"]["why"]


@pytest.mark.parametrize("precision,shape", [("fp16", TRT11_FP32), ("bf16", TRT10_FP16), ("int8", TRT10_FP16)])
def test_silently_other_precision_engines_are_refused(precision, shape):
    with pytest.raises(EngineError, match=f"shows no {precision.upper()}.*not written"):
        _check_precision_took(precision, build_record(precision, shape))


def test_the_network_must_carry_the_precision_before_the_engine_is_read():
    build = {
        "network": {"output_dtypes": {"FLOAT": 50}, "qdq_layers": 0},
        "engine_inspection": {"available": True, "summary": summarize_layers(TRT10_FP16)},
    }
    with pytest.raises(EngineError, match="no layer computes in FP16"):
        _check_precision_took("fp16", build)


def test_no_gpu_means_not_inspected():
    build = {"network": NETWORK["fp16"], "engine_inspection": {"available": False, "reason": "no GPU"}}
    assert _check_precision_took("fp16", build) == "not_inspected"


def test_summaries_count_by_layout():
    assert summarize_layers(NAMES_ONLY)["detail"] == "names_only"
    assert summarize_layers({"Layers": []})["detail"] == "none"
    trt10 = summarize_layers(TRT10_FP16)
    assert trt10["dtypes"] == {"fp16": 4, "fp32": 2} and trt10["fused"] == 0
    myelin = summarize_layers(MYELIN_ONLY)
    assert myelin["fused"] == 1 and myelin["fused_dtypes"] == {"int": 1, "fp32": 1}
    assert summarize_layers(TRT10_INT8)["dtypes"]["int8"] == 2  # activation format + INT8 weights
    assert summarize_layers([{"Name": "x", "LayerType": "gemm", "Precision": "FP16"}])["dtypes"] == {"fp16": 1}
    assert precision_verdict("fp32", summarize_layers(TRT11_FP32))[0] == "took"
