"""A model so costly that even the minimum holdout is over the FP32 budget calibrates on that many
puzzles and measures on them: the calibration pass's FP32 answers are the check's reference, so
FP32 runs once per build. Cheap models keep a separate holdout from the test split."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hrm_deploy.data.examples import load_examples


def _meta(name: str, steps: int) -> dict:
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.train.presets import preset

    model = {**preset(name)["model"], "forward_dtype": "float32"}
    config = HRMConfig(seq_len=81, vocab_size=11, num_puzzle_identifiers=1, **model)
    return {"config": dataclasses.asdict(config), "steps": steps}


def test_only_a_costly_model_shares_its_calibration_set():
    from hrm_deploy.precision.accuracy import CALIB_SAMPLES, MIN_HOLDOUT, calibration_size, shares_holdout

    assert not shares_holdout(_meta("sudoku-small", 8)) and calibration_size(_meta("sudoku-small", 8)) == CALIB_SAMPLES
    assert shares_holdout(_meta("sudoku", 16)) and calibration_size(_meta("sudoku", 16)) == MIN_HOLDOUT


@pytest.mark.parametrize("graph", ["unrolled", "step"])
def test_the_calibration_pass_gives_fp32s_answers(tiny_onnx, tmp_path, graph):
    """The outputs kept from the calibration runs are what the FP32 graph answers (every ACT step:
    a step graph's last run per batch)."""
    from hrm_deploy.export.metadata import graph_metadata
    from hrm_deploy.onnx_runtime import load_onnx
    from hrm_deploy.precision.accuracy import graph_outputs
    from hrm_deploy.precision.calibrate import QuantConfig, calibrate_ranges

    path = getattr(tiny_onnx, graph)
    model = load_onnx(path, weights=True)
    meta = graph_metadata(model)
    examples = load_examples(tiny_onnx.data, 10)
    cache = tmp_path / "ranges.json"
    outputs = calibrate_ranges(model, path, examples, QuantConfig(samples=10, batch=4), cache, meta, True, True)
    assert outputs is not None and len(outputs) == 10
    fp32 = graph_outputs(str(path), examples, meta=meta)
    np.testing.assert_allclose(outputs.logits, fp32.logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outputs.q_halt, fp32.q_halt, rtol=1e-5, atol=1e-5)  # the last step's, either mode
    assert calibrate_ranges(model, path, examples, QuantConfig(samples=10, batch=4), cache, meta, True, True) is None


def test_a_shared_holdout_uses_the_known_answers_and_grows_into_the_test_split(tiny_onnx):
    from hrm_deploy.precision.conductor import make_holdout
    from hrm_deploy.precision.rule import Outputs

    examples = load_examples(tiny_onnx.data, 8)
    ran: list[int] = []

    def outputs(count: int) -> Outputs:
        zeros = np.zeros((count, 2), np.float32)
        logits = np.random.default_rng(count).normal(size=(count, 81, 11)).astype(np.float32)
        return Outputs.of({"logits": logits, "q_halt_logits": zeros, "q_continue_logits": zeros})

    def run(path: Path, batch):
        ran.append(len(batch))
        return outputs(len(batch))

    known = outputs(8)
    job = SimpleNamespace(share_holdout=True, examples=examples, reference=known, source=Path("m.onnx"), meta={})
    holdout = make_holdout(job, tiny_onnx.data, None, run)
    assert holdout.size == 8 and holdout.cap > 8 and len(holdout.pool) > 8
    np.testing.assert_array_equal(holdout.pool.inputs[:8], examples.inputs)
    np.testing.assert_array_equal(holdout.reference(8).logits, known.logits)
    assert not ran  # FP32's answers on the calibration set are not computed again
    assert len(holdout.reference(16)) == 16 and ran == [8]  # grown: only the new puzzles
    job.reference = None  # calibration reused from the cache: the same puzzles, FP32 run on them
    holdout = make_holdout(job, tiny_onnx.data, None, run)
    assert len(holdout.reference(8)) == 8 and ran[-1] == 8


@pytest.mark.slow
def test_a_costly_models_cpu_int8_build_measures_on_its_calibration_set(tiny_onnx, tmp_path, monkeypatch):
    """Forced costly (the FP32 budget of the holdout set to nothing): the cpu target's static INT8
    calibrates on 64 puzzles, measures on them with FP32's answers from that pass, and says so."""
    import hrm_deploy.precision.accuracy as accuracy
    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.manifest import read_manifest

    monkeypatch.setattr(accuracy, "HOLDOUT_FLOPS", 1.0)
    config = EngineConfig("int8", target="cpu", calib_data=tiny_onnx.data)
    engine = build_engine(tiny_onnx.unrolled, config, tmp_path / "tiny.int8.cpu.onnx", quiet=True)
    recipe = read_manifest(engine.path)["recipe"]
    assert recipe["calibration"]["samples"] == accuracy.MIN_HOLDOUT
    assert "the calibration set" in recipe["accuracy"]["holdout"]
    assert recipe["accuracy"]["measured"]["holdout_puzzles"] >= accuracy.MIN_HOLDOUT
