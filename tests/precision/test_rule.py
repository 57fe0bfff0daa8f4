"""The accuracy rule of every quantized build (hrm_deploy/precision/rule.py): losses and gains in
words, paired flips deciding whether a holdout resolves the budget, a holdout that grows until it
does (or its cap), and the precision stage judging the graph it publishes by the same rule."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from hrm_deploy.data.examples import Examples
from hrm_deploy.errors import ConfigError
from hrm_deploy.precision.rule import GROWTH, Holdout, Quality, growth_cap


def test_losses_and_gains_are_words_not_signs():
    lost = Quality(91.0, 90.0, 99.0, 300, lost=6, gained=3).describe()
    gained = Quality(72.5, 74.06, 96.84, 64, lost=1, gained=2).describe()
    assert "1.00 points lost: 6 puzzles lost, 3 gained" in lost and "+" not in lost and "-" not in lost
    assert "1.56 points gained: 1 puzzles lost, 2 gained" in gained and "-" not in gained


def test_a_holdout_where_one_puzzle_is_over_the_budget_cannot_decide_it():
    """64 puzzles (one is 1.56 points) never settle a 1-point budget, whatever was seen; 300 clean
    ones do; flips on both sides leave a small measured loss within the noise."""
    assert not Quality(90.0, 90.0, 100.0, 64).settled(1.0)
    assert Quality(90.0, 90.0, 100.0, 300).settled(1.0)
    assert not Quality(91.0, 90.33, 99.9, 300, lost=6, gained=4).settled(1.0)
    assert Quality(90.0, 80.0, 99.0, 300, lost=30).settled(1.0)  # clearly outside
    assert Quality(None, None, 97.0, 10).settled(1.0)  # no labels: agreement is judged as measured


def _examples(count: int) -> Examples:
    rng = np.random.default_rng(0)
    labels = rng.integers(1, 10, (count, 4))
    return Examples(labels.astype(np.int32), np.arange(count, dtype=np.int32), labels, "pool", "")  # ids: positions


def _logits(answers: np.ndarray) -> np.ndarray:
    return np.eye(10, dtype=np.float32)[answers]


def test_the_holdout_grows_until_the_verdict_is_clear_then_stops(tmp_path):
    """FP32 solves every puzzle; the candidate misses none: 64 puzzles cannot settle the budget, the
    holdout doubles (FP32's answers computed once per puzzle) until it does."""
    pool = _examples(1000)
    runs: list[tuple[str, int]] = []

    def run(path: Path, examples: Examples) -> np.ndarray:
        runs.append((path.name, len(examples)))
        return _logits(examples.labels)

    candidate = tmp_path / "int8.onnx"
    candidate.write_bytes(b"graph")
    holdout = Holdout(tmp_path / "fp32.onnx", pool, run, 64)
    quality, how = holdout.decide(candidate, 1.0, growth_cap(64))
    assert quality.puzzles == 256 and how["settled"] and quality.within(1.0)
    assert sum(n for name, n in runs if name == "fp32.onnx") == 256  # each puzzle's reference once
    assert sum(n for name, n in runs if name == "int8.onnx") == 256  # and the candidate's: grown, not rerun
    candidate.write_bytes(b"another graph")  # a new file at the same path is measured afresh
    holdout.measure(candidate)
    assert runs[-1] == ("int8.onnx", 256)
    assert growth_cap(64) == GROWTH * 64


def test_at_the_cap_the_measured_loss_decides_and_the_record_says_so(tmp_path):
    pool = _examples(100)

    def run(path: Path, examples: Examples) -> np.ndarray:
        answers = examples.labels.copy()
        if path.name == "int8.onnx":  # puzzles 0, 25, 50, 75 lost, whichever slice is run
            answers[examples.puzzle_identifiers % 25 == 0, 0] = 0
        return _logits(answers)

    (tmp_path / "int8.onnx").write_bytes(b"graph")
    quality, how = Holdout(tmp_path / "fp32.onnx", pool, run, 64).decide(tmp_path / "int8.onnx", 1.0, 256)
    assert quality.puzzles == 100 and not how["settled"] and "measured loss decides" in how["why"]
    assert quality.lost == 4 and not quality.within(1.0)


def _stage(tiny_onnx, tmp_path, **kw):
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph

    cfg = PrecisionConfig(
        "int8",
        calib_data=tiny_onnx.data,
        cache_dir=str(tmp_path / "calib"),
        quant=QuantConfig(samples=32),
        holdout_samples=200,
        **kw,
    )
    return make_precision_graph(tiny_onnx.unrolled, cfg, out=tmp_path / "m.int8.onnx", quiet=True)


def _harmful(path) -> int:
    import onnx

    model = onnx.load(str(path))
    dq = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return sum(
        1
        for n in model.graph.node
        if "L_level" in n.name and "mlp" in n.name and n.op_type == "MatMul" and n.input[0] in dq
    )


def test_the_fallback_answers_to_the_agreement_rule_too(tiny_onnx, tmp_path, monkeypatch):
    """Exact accuracy unharmed but argmax agreement 96.84 % whatever is kept float: the stage used
    to stop its fallback on exact accuracy alone and publish; it refuses in one line with both
    measurements and the options, and writes nothing."""
    monkeypatch.setattr(Holdout, "measure", lambda self, path: Quality(72.5, 72.5, 96.84, self.size))
    with pytest.raises(ConfigError) as info:
        _stage(tiny_onnx, tmp_path, accuracy_budget=1.0)
    message = str(info.value)
    assert "\n" not in message and message.count("argmax agreement 96.84 %") == 2
    assert "--accuracy-budget" in message and "--fp16" in message and "nothing was written" in message
    assert not (tmp_path / "m.int8.onnx").exists() and not (tmp_path / "m.int8.onnx.manifest.json").exists()


def test_the_published_graph_is_measured_again_and_judged(tiny_onnx, tmp_path, monkeypatch):
    """The fallback's probes meet the budget but the graph written with those layers float does not
    (here: the published graph measures 5 points lost): the stage refuses instead of writing it."""

    def measure(self, path):
        exact = 100.0 - 5.0 * _harmful(path)
        if not str(path).endswith(".probe.onnx") and exact == 100.0:
            exact = 95.0  # the published graph, after the fallback
        return Quality(100.0, exact, 100.0, self.size, lost=round(self.size * (100.0 - exact) / 100))

    monkeypatch.setattr(Holdout, "measure", measure)
    with pytest.raises(ConfigError, match=r"even with \d+ layers kept float: exact 95.00 % vs FP32 100.00 % \(5.00"):
        _stage(tiny_onnx, tmp_path, accuracy_budget=1.0)
    assert not (tmp_path / "m.int8.onnx").exists()


@pytest.mark.slow
def test_the_accuracy_line_is_logged_once(tiny_onnx, tmp_path, capsys):
    """ORT's quantizer configures the root logger on its first module-level log call; the stage's
    accuracy line then printed twice (once as ``INFO:hrm_deploy.precision.convert:...``)."""
    from hrm_deploy.cli.logs import setup_logging

    root, logger = logging.getLogger(), logging.getLogger("hrm_deploy")
    saved = (list(root.handlers), list(logger.handlers), logger.level)
    root.handlers[:] = []  # a plain interpreter: the CLI's handler only
    try:
        setup_logging(False)
        _stage(tiny_onnx, tmp_path)
        err = capsys.readouterr().err
    finally:
        root.handlers[:], logger.handlers[:] = saved[0], saved[1]
        logger.setLevel(saved[2])
    lines = [line for line in err.splitlines() if "vs FP32 on" in line]
    assert len(lines) == 1 and not lines[0].startswith("INFO:"), err
