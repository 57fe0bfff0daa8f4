"""``arc-eval --early-stop``: a test input stops only where no completion of its copies can change
the requested pass@k or the submission, so scores and ``submission.json`` equal the full run's."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from hrm_deploy.arc.early_stop import chunk_rows, settled
from hrm_deploy.arc.score import SUBMISSION_K, rank

KS = (1, 2, 3)


def _outcome(candidates: list[tuple[str, float]], label: str | None) -> tuple:
    ranked = [h for h, _, _ in rank(candidates)]
    position = ranked.index(label) + 1 if label in ranked else None
    passes = tuple(position is not None and position <= k for k in KS)
    return passes, tuple(ranked[:SUBMISSION_K])


@pytest.mark.parametrize("seed", range(6))
def test_a_settled_outcome_is_the_same_for_every_completion(seed: int) -> None:
    """Brute force: random vote states, every way the remaining copies can vote (present or new
    candidates, q values at both extremes, so q tie-breaks are exercised)."""
    rng = np.random.default_rng(seed)
    checked = decided = 0
    for _ in range(150):
        present = [f"g{i}" for i in range(int(rng.integers(1, 5)))]
        votes = [
            (present[int(rng.integers(len(present)))], float(rng.random())) for _ in range(int(rng.integers(1, 9)))
        ]
        label = [None, "g0", "g1", "new0"][int(rng.integers(4))]
        remaining = int(rng.integers(0, 4))
        if not settled(votes, remaining, KS, [label]):
            continue
        decided += 1
        expected = None
        pool = sorted({h for h, _ in votes}) + [f"new{i}" for i in range(remaining)]
        for choice in itertools.product(pool, repeat=remaining):
            for q in (0.0, 1.0):
                outcome = _outcome(votes + [(h, q) for h in choice], label)
                expected = expected or outcome
                assert outcome == expected, (votes, remaining, label, choice)
                checked += 1
    assert decided > 10 and checked > decided  # the property was exercised, with real completions


def test_a_close_vote_and_a_large_k_are_not_settled() -> None:
    close = [("a", 0.9)] * 3 + [("b", 0.1)] * 2
    assert not settled(close, 1, (1,), ["a"])  # b could tie a: the q tie-break decides then
    assert settled(close, 0, (1,), ["a"])
    assert not settled([("a", 0.5)] * 5, 2, (1000,), ["z"])  # the label could still appear: run on
    assert settled([("a", 0.5)] * 9, 2, (1, 2), [None]) is False  # second place not known yet
    assert settled([("a", 0.5)] * 9 + [("b", 0.5)] * 5, 2, (1, 2), [None])


def test_chunks_scale_with_the_copies_so_a_small_num_aug_can_stop_early() -> None:
    assert chunk_rows(1001) == 32  # upstream's 1,000 augmentations: chunks of 32
    assert chunk_rows(151) == 5
    assert chunk_rows(9) == chunk_rows(1) == 1  # --num-aug 8: a decision after every copy


class PlantedSource:
    """A stand-in model whose copies mostly agree, as a trained one's do: each row answers its own
    (augmented) label 70 % of the time, a consistent runner-up 25 %, noise 5 %, as a function of the
    row. Early stop has real decisions to make on it."""

    def __init__(self, data, seed: int):
        from hrm_deploy.data.format import load_split

        split = load_split(data, "test")
        self.answers = {bytes(np.asarray(x, np.uint8)): np.asarray(y) for x, y in zip(split.inputs, split.labels)}
        self.seed, self.name = seed, f"planted-{seed}"
        self.seq_len, self.vocab_size, self.max_batch = split.metadata.seq_len, split.metadata.vocab_size, 16

    def fingerprint(self):
        return {"artifact": self.name}

    def check_ids(self, *args) -> None: ...
    def open(self) -> None: ...
    def close(self) -> None: ...
    def check_resumed(self, *args) -> None: ...

    def run(self, inputs, ids):
        preds, q = [], []
        for x in inputs:  # a function of the row alone, as a model's answer is
            key = bytes(np.asarray(x, np.uint8))
            rng = np.random.default_rng([self.seed, int.from_bytes(key[:8], "little"), len(key)])
            draw, answer = rng.random(), self.answers[key].copy()
            if draw < 0.05:  # noise: a grid of its own
                answer = rng.integers(0, 12, size=self.seq_len)
            elif draw < 0.3:  # a consistent runner-up: the test input copied (the same grid once un-augmented)
                answer = np.asarray(x)
            preds.append(answer)
            q.append(rng.normal())
        return np.stack(preds).astype(np.uint8), np.asarray(q), np.ones(len(inputs), np.int64)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["random-0", "random-1", "planted-0", "planted-1"])
def test_early_stop_scores_and_submission_equal_the_full_run(tmp_path, monkeypatch, model: str) -> None:
    """Two random tiny HRMs (their copies rarely agree: nothing to skip, scores equal) and two planted
    models (copies mostly agree: rows skipped, scores and submission still equal) on a dataset with
    151 copies per test input (chunks of 5 copies: 32 decisions per test input)."""
    import hrm_deploy.arc.evaluate as evaluate
    from hrm_deploy.arc.evaluate import ArcEvalConfig, arc_eval
    from hrm_deploy.data.arc import ArcSpec, build_arc
    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.model.hrm import build_model
    from tests.arc.test_data import make_tasks

    kind, seed = model.split("-")[0], int(model.split("-")[1])
    data = tmp_path / "arc"
    _, identifiers = build_arc(ArcSpec(str(make_tasks(tmp_path / "src", seed=seed)), num_aug=150, max_grid=5), data)
    config = HRMConfig(
        seq_len=25, vocab_size=12, num_puzzle_identifiers=len(identifiers), hidden_size=16, num_heads=2, H_layers=1,
        L_layers=1, H_cycles=1, L_cycles=1, halt_max_steps=1, expansion=2.0, puzzle_emb_ndim=16, pos_encodings="rope",
    )  # fmt: skip
    checkpoint = save_checkpoint(tmp_path / "model.pt", build_model(config, seed=seed).eval())
    if kind == "planted":  # the same planted answers in both runs (fresh rng per source)
        monkeypatch.setattr(evaluate, "open_source", lambda *a, **k: PlantedSource(data, seed))
    ks = (1, 2, 5)
    full = arc_eval(checkpoint, data, tmp_path / "full.json", config=ArcEvalConfig(ks=ks, batch=16, quiet=True))
    early = arc_eval(
        checkpoint,
        data,
        tmp_path / "early.json",
        config=ArcEvalConfig(ks=ks, batch=16, quiet=True, early_stop=True, price_per_hour=3.6),
    )
    assert early["pass_at"] == full["pass_at"]
    assert json.loads((tmp_path / "early.json").read_text()) == json.loads((tmp_path / "full.json").read_text())
    assert early["early_stop"]["rows_run"] + early["early_stop"]["rows_skipped"] == full["prediction_rows"]
    if kind == "planted":
        assert early["early_stop"]["rows_skipped"] > full["prediction_rows"] // 10  # it really stopped early
        assert full["pass_at"]["1"] == 1.0
    cost = early["cost"]
    assert set(cost["tasks"]) == set(json.loads((tmp_path / "full.json").read_text()))
    assert cost["rows"] == early["early_stop"]["rows_run"] and cost["mean_cost_per_task"] >= 0
    task = next(iter(cost["tasks"].values()))
    assert task["cost"] == pytest.approx(task["wall_s"] / 1000, abs=1e-6)  # 3.6 per hour = 0.001 per second
    if kind == "planted":  # an early-stopped run cut short resumes to the same result
        from hrm_deploy.arc.evaluate import output_paths

        saved = output_paths(tmp_path / "early.json")["early_preds"]
        data_bytes = saved.read_bytes()
        record = len(data_bytes) // early["early_stop"]["rows_run"]
        saved.write_bytes(data_bytes[: 40 * record + 3])
        again = arc_eval(
            checkpoint,
            data,
            tmp_path / "early.json",
            config=ArcEvalConfig(ks=ks, batch=16, quiet=True, early_stop=True),
        )
        assert again["pass_at"] == full["pass_at"]
        assert json.loads((tmp_path / "early.json").read_text()) == json.loads((tmp_path / "full.json").read_text())
