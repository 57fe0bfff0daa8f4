"""Every cpu build loads what it wrote in ONNX Runtime before publishing it: an FP16 loop graph (whose
offline optimization used to save a Cast under the same name in the loop's body and the outer graph,
a file ONNX Runtime then refused) works, and a graph the runtime refuses is one line, nothing written."""

from __future__ import annotations

import numpy as np
import pytest

import hrm_deploy.backends.ort.builder.cpu as cpu
from hrm_deploy.backends import open_runner
from hrm_deploy.backends.ort.builder.cpu import build_cpu
from hrm_deploy.backends.ort.builder.options import CpuOptions
from hrm_deploy.data.examples import load_examples
from hrm_deploy.engines.config import EngineConfig
from hrm_deploy.errors import EngineError
from hrm_deploy.runtime.infer import infer_all


def test_an_fp16_loop_graph_builds_loads_and_answers_as_fp32(tiny_loop, trained_tiny, tmp_path):
    built = build_cpu(
        tiny_loop,
        EngineConfig("fp16", target="cpu", options=CpuOptions(threads=1)),
        tmp_path / "l.fp16.cpu.ort.onnx",
        quiet=True,
    )
    assert built.build["loop_names_made_unique"] >= 1
    examples = load_examples(trained_tiny.data, 32, split="test")
    outputs = []
    for path in (tiny_loop, built.path):
        with open_runner(path, threads=1) as runner:
            outputs.append(infer_all(runner, examples, 16))
    agree = outputs[0]["logits"].argmax(-1) == outputs[1]["logits"].argmax(-1)
    assert agree.mean() >= 0.99 and np.array_equal(outputs[0]["steps_used"], outputs[1]["steps_used"])


def test_a_graph_the_runtime_refuses_is_one_line_and_nothing_is_written(tiny_loop, tmp_path, monkeypatch):
    monkeypatch.setattr(cpu, "unique_subgraph_names", lambda path: 0)  # the names as ONNX Runtime saved them
    out = tmp_path / "l.fp16.cpu.ort.onnx"
    with pytest.raises(
        EngineError, match=r"ONNX Runtime cannot load l.fp16.cpu.ort.onnx, the graph this build wrote \(.*\); nothing"
    ) as info:
        build_cpu(tiny_loop, EngineConfig("fp16", target="cpu", options=CpuOptions(threads=1)), out, quiet=True)
    assert "\n" not in str(info.value) and not out.exists() and not list(tmp_path.iterdir())


def test_a_checked_build_leaves_no_onnx_runtime_session_to_the_garbage_collector(tiny_onnx, tmp_path):
    """Every session the accuracy check opened is released when the build returns, by reference
    counting alone: a session left in a reference cycle is collected whenever the collector runs,
    and where that is a forked child (a data generator's worker pool) it can hang there."""
    import gc

    import onnxruntime as ort

    config = EngineConfig(
        "int8",
        target="cpu",
        calib_data=tiny_onnx.data,
        calib_samples=16,
        holdout_samples=64,
        calib_cache=str(tmp_path),
        options=CpuOptions(threads=1),
    )
    gc.collect()
    gc.disable()
    try:
        build_cpu(tiny_onnx.unrolled, config, tmp_path / "t.int8.cpu.ort.onnx", quiet=True)
        alive = [o for o in gc.get_objects() if type(o) is ort.InferenceSession]
    finally:
        gc.enable()
    assert not alive
