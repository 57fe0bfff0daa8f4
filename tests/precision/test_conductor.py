"""The conductor of every quantized build (hrm_deploy/precision/conductor.py), on candidates whose
harm is known: the graph published is the one certified last, its float set recorded by node name;
screens run only where the all-quantized graph differed; a certification that refutes the screens'
choice moves the search up; outside the rule nothing is published; the same inputs give the same
verdict; the cost is estimated before measuring."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import hrm_deploy.precision.conductor as conductor
import hrm_deploy.precision.sensitivity as sensitivity
from hrm_deploy.data.examples import Examples
from hrm_deploy.errors import ConfigError
from hrm_deploy.precision.calibrate import QuantPlan
from hrm_deploy.precision.holdout import CHUNK, Holdout
from hrm_deploy.precision.rule import Outputs, Rule
from hrm_deploy.progress import Stages

WEIGHTS = 6
PUZZLES = 300


def _model() -> onnx.ModelProto:
    """x -> MatMul(W0) -> ... -> MatMul(W5): one node per weight (names mm0..mm5)."""
    nodes, inits = [], []
    for i in range(WEIGHTS):
        nodes.append(helper.make_node("MatMul", [f"h{i}", f"W{i}"], [f"h{i + 1}"], name=f"mm{i}"))
        inits.append(numpy_helper.from_array(np.eye(4, dtype=np.float32), f"W{i}"))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info(f"h{WEIGHTS}", TensorProto.FLOAT, [1, 4])],
        inits,
    )
    return helper.make_model(graph)


class Candidates:
    """Writes each candidate as the JSON list of the nodes it keeps float."""

    name = "TOY"

    def __init__(self) -> None:
        self.written: list[tuple[str, ...]] = []

    def write(self, exclude: tuple[str, ...], out: Path) -> None:
        self.written.append(exclude)
        out.write_text(json.dumps(sorted(exclude)))

    def qdq(self) -> onnx.ModelProto:
        return _model()


def _run(harm):
    """A run where FP32 answers every puzzle right and a candidate loses the puzzles ``harm(float
    nodes, puzzle ids)`` marks; ``ran`` counts the puzzles each file ran."""
    ran: dict[str, int] = {}

    def run(path: Path, examples: Examples) -> Outputs:
        ran[path.name] = ran.get(path.name, 0) + len(examples)
        answers = examples.labels.copy()
        if path.name != "fp32.onnx":
            kept = set(json.loads(path.read_text()))
            answers[harm(kept, examples.puzzle_identifiers), 0] = 0
        heads = {
            "logits": 0.9 + 0.1 * np.eye(10, dtype=np.float32)[answers],  # unsure: flips verify excuses
            "q_halt_logits": np.ones(len(answers), np.float32),
            "q_continue_logits": np.zeros(len(answers), np.float32),
        }
        return Outputs.of(heads)

    return run, ran


def _conduct(tmp_path, monkeypatch, harm, caplog=None, fp32_cost=None, run=None, streams=1):
    """Conduct the toy build: ranking mm0 first, then mm1, ...; returns (verdict, files run, written).
    ``streams``: the runs that may go at once."""
    rng = np.random.default_rng(0)
    labels = rng.integers(1, 10, (PUZZLES, 4))
    pool = Examples(labels.astype(np.int32), np.arange(PUZZLES, dtype=np.int32), labels, "pool", "")
    default, ran = _run(harm)
    run = run or default
    model = _model()
    job = SimpleNamespace(
        model=model,
        plan=QuantPlan([f"mm{i}" for i in range(WEIGHTS)]),
        source=tmp_path / "fp32.onnx",
        meta={"mode": "unrolled", "steps": 1},
        share_holdout=False,
        fp32_seconds_per_puzzle=fp32_cost,
    )
    holdout = Holdout(tmp_path / "fp32.onnx", pool, run, 300, 300, streams=streams)
    monkeypatch.setattr(conductor, "make_holdout", lambda *a: holdout)
    ranking = {f"W{i}": float(WEIGHTS - i) for i in range(WEIGHTS)}
    monkeypatch.setattr(sensitivity, "local_errors", lambda *a: ranking)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    candidates = Candidates()
    check = conductor.Check(Rule.of("int8"), "data", run, streams=streams)
    verdict = conductor.conduct(job, candidates, check, work, Stages(quiet=caplog is None))  # type: ignore[arg-type]
    return verdict, ran, candidates.written


def _no_harm(kept, ids):  # no answer lost by the toy's own harm
    return ids < 0


def _sure_of_puzzle_5(spoil):
    """A run where FP32 answers every puzzle right and is sure of puzzle 5's cell 1 (its margin
    there the whole scale); ``spoil(path, logits, sure)`` edits each candidate's logits in place
    (``sure``: the rows of puzzle 5)."""
    clean, _ = _run(_no_harm)

    def run(path: Path, examples: Examples) -> Outputs:
        out = clean(path, examples)
        logits = out.logits.copy()
        sure = examples.puzzle_identifiers == 5
        logits[sure, 1] = 0.0
        logits[sure, 1, examples.labels[sure, 1]] = 1.0  # FP32 sure of puzzle 5's cell 1
        if path.name != "fp32.onnx":
            spoil(path, logits, sure)
        return Outputs.of({"logits": logits, "q_halt_logits": out.q_halt, "q_continue_logits": out.q_halt})

    return run


def _lost_by(weight: int, ids: np.ndarray) -> np.ndarray:
    return ids % 10 == weight  # 10 % of the puzzles per harmful weight


def test_the_published_graph_is_the_one_certified_last_and_its_float_set_is_recorded(tmp_path, monkeypatch):
    """mm0 and mm1 each lose 10 % of the puzzles when quantized: the all-quantized graph stops once
    its failure is certain, the fallback screens the puzzles it ran, keeps both float, and publishes
    the file it certified."""

    def harm(kept, ids):
        return np.any([_lost_by(w, ids) for w in (0, 1) if f"mm{w}" not in kept], axis=0) if len(kept) < 2 else ids < 0

    verdict, ran, written = _conduct(tmp_path, monkeypatch, harm)
    assert verdict.kept == ("mm0", "mm1") and json.loads(verdict.path.read_text()) == ["mm0", "mm1"]
    record = verdict.record
    assert record["kept_float_nodes"] == ["mm0", "mm1"] and [k["weight"] for k in record["kept_float"]] == ["W0", "W1"]
    assert record["measured"]["loss_points"] == 0.0 and record["measured"]["holdout_puzzles"] == PUZZLES
    # all quantized: 4 of the first 16 puzzles lost (0, 1, 10, 11) is over the budget of 300 whatever
    # the rest does (FP32 solves every puzzle: none can be gained): stopped there
    assert record["all_quantized"]["puzzles_lost"] == 4 and record["all_quantized"]["holdout_puzzles"] == 16
    assert "failure certain after 16 of 300" in record["all_quantized_decided"]["why"]
    # mm0 float alone passes its screen of those 16 (1 and 11 lost, 3 with one to spare) but not the
    # holdout (31 lost by puzzle 31: certain there); the front widens to its 32, mm0 and mm1 pass
    assert record["fallback"]["screened_puzzles"] == 32 and record["fallback"]["screens_stand_for"] == 300
    assert record["fallback"]["certifications"] == 3
    assert ran["fp32.onnx"] == PUZZLES  # FP32 once per puzzle
    assert ran[verdict.path.name] == PUZZLES  # its certification ran only the puzzles its screen had not
    cost = record["cost"]
    assert cost["candidate_puzzle_runs_by_kind"] == {
        "all_quantized": 16,
        "screens": 16 + 32,
        "certifications": 16 + 268,
    }
    assert cost["candidate_puzzle_runs"] == sum(cost["candidate_puzzle_runs_by_kind"].values())
    assert cost["candidate_graphs_written"] == len(written) == 3
    assert sorted(p.name for p in verdict.path.parent.iterdir()) == [verdict.path.name]  # the others removed
    assert written[0] == ()  # the all-quantized candidate first


def test_a_certification_that_refutes_the_screens_moves_the_search_up(tmp_path, monkeypatch):
    """With mm0 float and mm1 quantized the graph loses puzzles the all-quantized graph never ran
    (its failure was certain first: the screen cannot see them): its certification fails, the front
    widens to what it ran, and the search keeps mm1 float too."""

    def harm(kept, ids):
        if "mm0" not in kept:
            return _lost_by(0, ids)
        if "mm1" not in kept:
            return (ids % 7 == 3) & (ids % 10 > 1) & (ids >= 100)  # puzzles past all-quantized's 32
        return ids < 0

    verdict, _, _ = _conduct(tmp_path, monkeypatch, harm)
    assert verdict.kept == ("mm0", "mm1") and verdict.record["fallback"]["certifications"] == 3
    assert verdict.record["all_quantized"]["holdout_puzzles"] == 32  # 0, 10, 20, 30 lost
    assert verdict.record["fallback"]["screened_puzzles"] == 136  # 108, 115, 122, 129 lost by 136


def test_outside_the_rule_nothing_is_published_and_the_line_gives_both_measurements(tmp_path, monkeypatch):
    def harm(kept, ids):
        return ids % 10 < 5  # half the puzzles lost whatever is kept float

    with pytest.raises(ConfigError) as info:
        _conduct(tmp_path, monkeypatch, harm)
    message = str(info.value)
    # both measurements: all quantized (certain after 8 puzzles: 0..4 lost) and the last screen's
    assert "\n" not in message and message.count(" 5 puzzles lost") == 2 and "nothing was written" in message
    assert "--accuracy-budget" in message and not list((tmp_path / "work").iterdir())


def test_a_non_finite_output_fails_the_rule(tmp_path, monkeypatch):
    """A candidate with a NaN among its outputs is outside the rule however right its answers are:
    the fallback keeps float the weight that made it."""

    def harm(kept, ids):
        return ids < 0  # no answer lost

    clean, _ = _run(harm)

    def run(path, examples):
        out = clean(path, examples)
        if path.name == "fp32.onnx" or "mm2" in json.loads(path.read_text()):
            return out
        logits = out.logits.copy()
        logits[0, 0, 0] = np.nan
        return Outputs.of({"logits": logits, "q_halt_logits": out.q_halt, "q_continue_logits": out.q_halt})

    verdict, _, _ = _conduct(tmp_path, monkeypatch, harm, run=run)
    assert verdict.kept == ("mm0", "mm1", "mm2") and verdict.record["all_quantized"]["nonfinite_values"] > 0
    assert verdict.record["measured"]["nonfinite_values"] == 0


def test_an_answer_flipped_where_fp32_was_sure_keeps_its_weight_float(tmp_path, monkeypatch):
    """One cell of one puzzle flipped where FP32 was sure (the toy's FP32 margin there raised to the
    whole scale) fails the rule as it fails verify, though no puzzle is lost beyond the budget: the
    fallback keeps float the weight that made it."""

    def spoil(path, logits, sure):
        if "mm3" not in json.loads(path.read_text()):
            logits[sure, 1] = logits[sure, 1, ::-1]  # its answer flipped, far from the others

    verdict, _, _ = _conduct(tmp_path, monkeypatch, _no_harm, run=_sure_of_puzzle_5(spoil))
    assert verdict.record["all_quantized"]["largest_flip_margin"] == 1.0
    assert verdict.kept == ("mm0", "mm1", "mm2", "mm3") and verdict.record["measured"]["largest_flip_margin"] == 0.0


def test_the_same_inputs_give_the_same_verdict(tmp_path, monkeypatch):
    def harm(kept, ids):
        return _lost_by(0, ids) if "mm0" not in kept else ids < 0

    verdicts = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        verdicts.append(_conduct(tmp_path / name, monkeypatch, harm)[0])
    first, second = ({k: v for k, v in v.record.items() if k != "cost"} for v in verdicts)
    assert first == second and verdicts[0].path.read_bytes() == verdicts[1].path.read_bytes()


def test_the_verdict_and_its_counts_do_not_depend_on_the_streams(tmp_path, monkeypatch):
    """The same build measured one run at a time and four at once, the runs finishing out of order:
    the same record (puzzles run by kind, screens, certifications, the front), the same float set
    and the same published bytes; only the seconds differ."""
    import random
    import time

    def harm(kept, ids):
        return (_lost_by(0, ids) if "mm0" not in kept else ids < 0) | (_lost_by(1, ids) & ("mm1" not in kept))

    shuffle = random.Random(0)
    plain, _ = _run(harm)

    def late(path: Path, examples: Examples) -> Outputs:  # later calls often finish first
        time.sleep(shuffle.random() / 500)
        return plain(path, examples)

    made = []
    for streams in (1, 4):
        (tmp_path / str(streams)).mkdir()
        verdict = _conduct(tmp_path / str(streams), monkeypatch, harm, run=late, streams=streams)[0]
        cost = {k: v for k, v in verdict.record["cost"].items() if not k.endswith("seconds")}
        made.append(({k: v for k, v in verdict.record.items() if k != "cost"}, cost, verdict.path.read_bytes()))
    assert made[0] == made[1]
    assert made[0][0]["kept_float_nodes"] == ["mm0", "mm1"] and made[0][1]["screens"] >= 2


def test_the_cost_is_estimated_before_measuring(tmp_path, monkeypatch, caplog):
    def harm(kept, ids):
        return ids < 0

    with caplog.at_level(logging.INFO, logger="hrm_deploy.precision.conductor"):
        _conduct(tmp_path, monkeypatch, harm, caplog=caplog, fp32_cost=0.5)
    lines = [r.getMessage() for r in caplog.records]
    estimate = next(i for i, line in enumerate(lines) if "the verdict needs" in line)
    assert "600 puzzle runs on 300 held-out puzzles" in lines[estimate] and "about 300 s" in lines[estimate]
    assert estimate < next(i for i, line in enumerate(lines) if "certified on the holdout" in line)


def test_the_progress_line_says_what_is_left_as_the_holdout_grows(tmp_path):
    """After each run of puzzles the line gives the runs left in the measurement under way and their
    seconds at the measured cost per puzzle; a larger measurement raises what is left."""
    rng = np.random.default_rng(0)
    labels = rng.integers(1, 10, (PUZZLES, 4))
    pool = Examples(labels.astype(np.int32), np.arange(PUZZLES, dtype=np.int32), labels, "pool", "")
    run, _ = _run(lambda kept, ids: ids < 0)
    holdout = Holdout(tmp_path / "fp32.onnx", pool, run, 100, 300)
    lines: list[str] = []
    meter = conductor.Meter(holdout, 0.5, lines.append, "certifying")
    holdout.tally.on_run = meter.show
    candidate = tmp_path / "c.onnx"
    Candidates().write((), candidate)
    holdout.measure(candidate, 100)
    fp32_left = 100 - CHUNK  # after FP32's first run call (the candidate runs once FP32's are known)
    assert f"100 puzzles (up to 300 if undecided), {fp32_left} FP32 and up to 100 candidate runs left" in lines[0]
    assert lines[-1].endswith("0 FP32 and up to 0 candidate runs left, about 0 s left at most")
    said = len(lines)
    holdout.measure(candidate, 200)
    assert f"200 puzzles (up to 300 if undecided), {fp32_left} FP32 and up to 100 candidate runs left" in lines[said]


@pytest.mark.parametrize("wrong", ["nan", "confident wrong answer", "garbage position"])
def test_a_candidate_wrong_whatever_is_kept_float_is_refused_after_every_certification(tmp_path, monkeypatch, wrong):
    """The fallback certifies up to MAX_CERTIFICATIONS mixes: each more one is a chance to publish,
    never a looser rule. A candidate wrong whatever the fallback keeps float (a NaN; one puzzle's
    answer flipped where FP32 was sure; one position confidently wrong on every puzzle) is refused
    after all of them, and nothing is written."""

    def spoil(path, logits, sure):
        if wrong == "nan":
            logits[0, 0, 0] = np.nan
        elif wrong == "confident wrong answer":
            logits[sure, 1] = logits[sure, 1, ::-1]
        else:  # position 2 of every puzzle: a confident answer FP32 never gives
            logits[:, 2] = 0.0
            logits[:, 2, 0] = 5.0

    with pytest.raises(ConfigError, match="outside the accuracy rule") as info:
        _conduct(tmp_path, monkeypatch, _no_harm, run=_sure_of_puzzle_5(spoil))
    kept = int(re.search(r"even with (\d+) layers kept float", str(info.value)).group(1))
    assert kept >= 1 and "nothing was written" in str(info.value) and not list((tmp_path / "work").iterdir())
