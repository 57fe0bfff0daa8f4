"""Calibration: the activation ranges every Q/DQ precision reads, measured in one pass over the data
on the chosen ONNX Runtime provider."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from hrm_deploy.data.examples import load_examples
from hrm_deploy.precision.calibrate import QuantConfig


def _weighted_inputs(path):
    from hrm_deploy.precision.calibrate import plan_nodes

    model = onnx.load(str(path))
    by_name = {n.name: n for n in model.graph.node}
    return sorted({by_name[n].input[0] for n in plan_nodes(model, QuantConfig(exclude_patterns=())).quantize})


def _reference_peaks(path, tensors, examples, steps):
    """max |x| of every tensor, read as plain graph outputs (the step graph driven by hand)."""
    import onnxruntime as ort

    model = onnx.load(str(path))
    model.graph.output.extend(onnx.helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in tensors)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = examples.feeds(0, len(examples))
    if "z_H" not in {i.name for i in session.get_inputs()}:
        return dict(zip(tensors, (np.abs(v).max() for v in session.run(tensors, feeds))))
    peaks = dict.fromkeys(tensors, 0.0)
    z_H = z_L = np.zeros((len(examples), *session.get_inputs()[2].shape[1:]), np.float32)
    for step in range(steps):
        z_H, z_L, *values = session.run(
            ["z_H_out", "z_L_out", *tensors],
            {**feeds, "z_H": z_H, "z_L": z_L, "reset": np.full(len(examples), step == 0)},
        )
        peaks = {t: max(peaks[t], float(np.abs(v).max())) for t, v in zip(tensors, values)}
    return peaks


@pytest.mark.parametrize("graph", ["unrolled", "step"])
def test_minmax_ranges_are_each_tensors_peak_in_one_pass(tiny_onnx, tmp_path, monkeypatch, graph):
    """The in-graph reductions (one vector output) give each tensor its own max |x| over every
    batch and step; a single-step graph reads its carry from the collecting run itself: one
    session, one run per batch and step (no separate float pass)."""
    import onnxruntime as ort
    from onnxruntime.quantization.calibrate import load_tensors_data

    from hrm_deploy.precision.calibrate import _calibrate

    path, steps = getattr(tiny_onnx, graph), 3
    tensors = _weighted_inputs(path)
    examples = load_examples(tiny_onnx.data, 8)
    sessions, runs = [], []

    class Counting(ort.InferenceSession):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            sessions.append(self)

        def run(self, *args, **kwargs):
            runs.append(self)
            return super().run(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Counting)
    cache = tmp_path / "ranges.json"
    model = onnx.load(str(path))
    _calibrate(model, path, tensors, examples, QuantConfig(samples=8, batch=4), graph, steps, cache, None)
    assert len(sessions) == 1 and len(runs) == 2 * (steps if graph == "step" else 1)
    monkeypatch.undo()
    ranges = load_tensors_data(str(cache))
    expected = _reference_peaks(path, tensors, examples, steps)
    assert len(tensors) > 3
    for name in tensors:
        low, high = (float(v) for v in ranges[name].range_value)
        assert low == -high and high == pytest.approx(expected[name], rel=1e-5), name


def test_calibration_runs_on_cuda_when_onnxruntime_has_it(monkeypatch):
    import onnxruntime as ort

    from hrm_deploy.precision.calibrate import calibration_provider

    gpu_build = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: gpu_build)
    assert calibration_provider() == "cuda"
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["AzureExecutionProvider", "CPUExecutionProvider"])
    assert calibration_provider() == "cpu"


def test_the_calibration_session_is_created_on_the_chosen_providers(tiny_onnx, monkeypatch):
    import onnxruntime as ort

    import hrm_deploy.precision.calibrate as int8

    asked = []

    class Recording(ort.InferenceSession):
        def __init__(self, model, options=None, providers=None, **kwargs):
            asked.append(providers)
            super().__init__(model, options, providers=["CPUExecutionProvider"], **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Recording)
    monkeypatch.setattr(int8, "calibration_provider", lambda: "cuda")
    session, fetch = int8.range_session(
        onnx.load(str(tiny_onnx.step)), tiny_onnx.step, _weighted_inputs(tiny_onnx.step), "minmax"
    )
    assert asked == [["CUDAExecutionProvider", "CPUExecutionProvider"]] and fetch == [int8.RANGES_OUTPUT]


@pytest.mark.slow
def test_a_tampered_or_damaged_cache_entry_is_measured_again(tiny_onnx, tmp_path, caplog):
    """Scaled ranges in a calib/ entry once made an INT8 graph that solved nothing, announced only as
    'cached calibration': an entry that does not match its seal, or holds a non-finite range even
    when resealed, is calibrated again with a one-line warning, and the graph equals a clean build's."""
    import json
    import logging

    from hrm_deploy.io import sha256_file
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph

    def build(name):
        cfg = PrecisionConfig(
            "int8",
            calib_data=tiny_onnx.data,
            cache_dir=str(tmp_path / "calib"),
            quant=QuantConfig(samples=16),
            accuracy_check=False,
        )
        return make_precision_graph(tiny_onnx.unrolled, cfg, out=tmp_path / f"{name}.int8.onnx", quiet=True)

    clean = build("clean")
    cache = Path(clean.report["calibration"]["cache"])
    seal = cache.with_name(cache.name + ".seal")
    assert seal.is_file() and json.loads(seal.read_text())["sha256"] == sha256_file(cache)
    good = cache.read_text()

    def edit(text: str, value) -> str:  # every range of ORT's JSON replaced by value(range)
        data = json.loads(text)
        for entry in data["data"].values():
            for side in ("lowest", "highest"):
                entry[side]["data"] = value(entry[side]["data"])
        return json.dumps(data)

    for damage, needle in (
        (lambda text: edit(text, lambda x: x * 1000.0), "does not match its seal"),
        (lambda text: edit(text, lambda x: float("nan")), "not finite"),
    ):
        cache.write_text(damage(good))
        if needle == "not finite":  # resealed by hand: the ranges themselves are still checked
            seal.write_text(json.dumps({**json.loads(seal.read_text()), "sha256": sha256_file(cache)}))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hrm_deploy.precision.calibrate"):
            again = build("again")
        assert not again.report["calibration"]["reused"]
        assert any(needle in r.getMessage() and "calibrating again" in r.getMessage() for r in caplog.records)
        assert again.path.read_bytes() == clean.path.read_bytes()
        assert cache.read_text() == good
