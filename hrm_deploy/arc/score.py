"""Upstream's ARC metric on saved predictions (pure numpy).

Every prediction row is cropped at its end-of-grid border, its augmentation undone and its grid
hashed; rows are grouped by task and by the (un-augmented) test input. Candidates rank by
(vote count, mean sigmoid(q_halt)), highest first, ties in order of first appearance (Python's
stable sort, as upstream). A test input passes@k when its label is among the top k; a task's
score is the fraction of its test inputs that pass (TRM's ``evaluators/arc.py``), or 1 only when
all pass (HRM's ``arc_eval.ipynb``); pass@k is the mean over tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hrm_deploy.arc.choices import TaskScore
from hrm_deploy.data.arc_grids import crop_batch, grid_hash, inverse_augment, parse_name, to_grid
from hrm_deploy.errors import DataError

log = logging.getLogger(__name__)

PASS_KS = (1, 2, 5, 10, 100, 1000)
SUBMISSION_K = 2


@dataclass
class ArcTestInput:
    """One test input of a task: its grid, its label (None when unknown) and hashes."""

    input_hash: str
    label: np.ndarray | None
    label_hash: str | None


def _checked_ids(puzzle_identifiers: np.ndarray, identifier_map: Sequence[str]) -> np.ndarray:
    ids = np.asarray(puzzle_identifiers).astype(np.int64)
    if ids.size and (ids.max() >= len(identifier_map) or ids.min() < 0):
        raise DataError(
            f"puzzle identifier {int(ids.max())} is outside identifiers.json ({len(identifier_map)} names); "
            "use the identifiers.json of the dataset the predictions were made on"
        )
    return ids


def vote_key(name: str, cropped_input: np.ndarray) -> tuple[str, str]:
    """The test input a row votes for: (its task, the hash of its un-augmented input grid)."""
    return parse_name(name)[0], grid_hash(inverse_augment(name, cropped_input))


@dataclass
class Votes:
    """Predictions grouped as upstream does: task -> input hash -> [(grid hash, sigmoid q_halt)]."""

    preds: dict[str, dict[str, list[tuple[str, float]]]] = field(default_factory=dict)
    grids: dict[str, np.ndarray] = field(default_factory=dict)
    rows: int = 0

    def add(
        self,
        identifier_map: Sequence[str],
        puzzle_identifiers: np.ndarray,
        inputs: np.ndarray,
        predictions: np.ndarray,
        q_halt_logits: np.ndarray,
        blank_identifier_id: int = 0,
    ) -> None:
        """Add rows: ``inputs`` / ``predictions`` (argmax tokens) [N, side*side], ``q_halt_logits`` [N]
        at the last ACT step. Rows of the blank identifier (padding) are skipped."""
        ids = _checked_ids(puzzle_identifiers, identifier_map)
        keep = ids != blank_identifier_id
        q = 1.0 / (1.0 + np.exp(-np.asarray(q_halt_logits, dtype=np.float64)))
        for ident, inp, pred, qv in zip(
            ids[keep],
            crop_batch(np.asarray(inputs)[keep]),
            crop_batch(np.asarray(predictions)[keep]),
            q[keep],
        ):
            name = identifier_map[ident]
            task, input_hash = vote_key(name, inp)
            pred = inverse_augment(name, pred)
            pred_hash = grid_hash(pred)
            self.grids[pred_hash] = pred
            by_input = self.preds.setdefault(task, {})
            by_input.setdefault(input_hash, []).append((pred_hash, float(qv)))
            self.rows += 1


def labels_from_split(
    identifier_map: Sequence[str], puzzle_identifiers: np.ndarray, inputs: np.ndarray, labels: np.ndarray
) -> dict[str, list[ArcTestInput]]:
    """HRM's labels: the original (un-augmented) rows of the test split, in dataset order."""
    tests: dict[str, list[ArcTestInput]] = {}
    ids = _checked_ids(puzzle_identifiers, identifier_map)
    is_original = np.array([parse_name(name)[2] is None for name in identifier_map], dtype=bool)
    is_original[0] = False  # <blank>
    original = is_original[ids]  # only these rows are read from a memory-mapped split
    for ident, inp, lab in zip(ids[original], crop_batch(inputs[original]), crop_batch(labels[original])):
        tests.setdefault(identifier_map[int(ident)], []).append(ArcTestInput(grid_hash(inp), lab, grid_hash(lab)))
    return tests


def labels_from_puzzles(puzzles: dict[str, Any]) -> dict[str, list[ArcTestInput]]:
    """TRM's labels: ``test_puzzles.json`` (ARC task JSON: task -> {"test": [{"input", "output"}]});
    a test without ``output`` has no label (scored as not passing, still in the submission)."""
    tests: dict[str, list[ArcTestInput]] = {}
    for name, puzzle in puzzles.items():
        entries = tests.setdefault(name, [])
        for i, pair in enumerate(puzzle.get("test", [])):
            where = f"test_puzzles.json {name} test {i}"
            label = to_grid(pair["output"], where + " output") if "output" in pair else None
            entries.append(
                ArcTestInput(
                    grid_hash(to_grid(pair["input"], where)), label, grid_hash(label) if label is not None else None
                )
            )
    return tests


def rank(candidates: list[tuple[str, float]]) -> list[tuple[str, int, float]]:
    """(grid hash, votes, mean sigmoid q_halt), best first; upstream's sort (stable, reversed)."""
    stats: dict[str, list[float]] = {}
    for h, q in candidates:
        s = stats.setdefault(h, [0, 0.0])
        s[0] += 1
        s[1] += q
    ordered = sorted(((h, (int(s[0]), s[1] / s[0])) for h, s in stats.items()), key=lambda kv: kv[1], reverse=True)
    return [(h, n, q) for h, (n, q) in ordered]


@dataclass(frozen=True)
class ArcScore:
    """pass@k overall and per task, and the ARC Prize submission."""

    pass_at: dict[int, float]
    tasks: dict[str, dict[str, Any]]
    submission: dict[str, list[dict[str, list[list[int]]]]]
    task_score: TaskScore
    rows: int

    def to_json(self) -> dict[str, Any]:
        return {
            "pass_at": {str(k): v for k, v in self.pass_at.items()},
            "task_score": self.task_score.value,
            "tasks_scored": len(self.tasks),
            "prediction_rows": self.rows,
            "tasks": self.tasks,
        }


def score(
    tests: dict[str, list[ArcTestInput]],
    votes: Votes,
    ks: Sequence[int] = PASS_KS,
    task_score: TaskScore = TaskScore.FRACTION,
) -> ArcScore:
    """pass@k over ``tests`` from ``votes``, and the submission (top 2 per test input, the first
    repeated when only one candidate exists)."""
    if not tests:
        raise DataError("no test puzzles to score: the dataset's test split has no original (un-augmented) puzzles")
    ks = tuple(sorted(set(int(k) for k in ks)))
    if not ks or ks[0] < 1:
        raise DataError(f"--k values must be positive integers, got {list(ks)}")
    totals = dict.fromkeys(ks, 0.0)
    tasks: dict[str, dict[str, Any]] = {}
    submission: dict[str, list[dict[str, list[list[int]]]]] = {}
    for name, entries in tests.items():
        passed = dict.fromkeys(ks, 0)
        details = []
        submission[name] = []
        for test in entries:
            ranked = rank(votes.preds.get(name, {}).get(test.input_hash, []))
            position = next((i + 1 for i, (h, _, _) in enumerate(ranked) if h == test.label_hash), None)
            for k in ks:
                passed[k] += position is not None and position <= k
            details.append({"candidates": len(ranked), "votes": sum(n for _, n, _ in ranked), "label_rank": position})
            if not ranked:
                log.warning("task %s: a test input has no predictions; its submission attempts are [[0]]", name)
                attempts = [np.zeros((1, 1), np.uint8)] * SUBMISSION_K
            else:
                attempts = [votes.grids[h] for h, _, _ in ranked[:SUBMISSION_K]]
                attempts += [attempts[0]] * (SUBMISSION_K - len(attempts))
            submission[name].append({f"attempt_{i + 1}": g.tolist() for i, g in enumerate(attempts)})
        per_task = {}
        for k in ks:
            if task_score is TaskScore.FRACTION:
                per_task[k] = passed[k] / len(entries) if entries else 0.0
            else:
                per_task[k] = float(bool(entries) and passed[k] == len(entries))
            totals[k] += per_task[k]
        tasks[name] = {"pass_at": {str(k): v for k, v in per_task.items()}, "tests": details}
    pass_at = {k: totals[k] / len(tests) for k in ks}
    return ArcScore(pass_at, tasks, submission, task_score, votes.rows)


def markdown(report: dict[str, Any]) -> str:
    """A short human-readable report: pass@k and the per-task table."""
    ks = list(report["pass_at"])
    halting = report.get("halting")
    lines = [
        "# ARC evaluation" + (f" (per-row halting: --halt {halting['rule']})" if halting else ""),
        "",
        f"Tasks: {report['tasks_scored']}, prediction rows: {report['prediction_rows']}, "
        f"task score: {report['task_score']}.",
        "",
        "| " + " | ".join(f"pass@{k}" for k in ks) + " |",
        "|" + "---|" * len(ks),
        "| " + " | ".join(f"{100 * report['pass_at'][k]:.2f}%" for k in ks) + " |",
        "",
    ]
    for key in ("artifact", "data", "reference", "pass2_difference_points", "max_pass2_difference_points", "passed"):
        if key in report:
            lines.append(f"- {key.replace('_', ' ')}: {report[key]}")
    if "early_stop" in report:
        stop = report["early_stop"]
        lines.append(
            f"- early stop: {stop['rows_run']} rows run, {stop['rows_skipped']} skipped (scores as a full run)"
        )
    if halting:
        lines.append(
            f"- halting on (--halt {halting['rule']}): each row stopped at its own halting step, "
            f"{halting['mean_act_steps']:.2f} of {halting['max_act_steps']} ACT steps per row on average; "
            "scores can differ from the all-steps vote (upstream's)"
        )
    if "cost" in report:
        cost = report["cost"]
        line = f"- time: {cost['wall_s']} s of inference, {cost['mean_wall_s_per_task']} s per task"
        if "mean_cost_per_task" in cost:
            line += f"; cost {cost['mean_cost_per_task']:.6f} per task at {cost['price_per_hour']} per hour"
        lines.append(line)
    lines += [
        "",
        "| task | " + " | ".join(f"pass@{k}" for k in ks) + " | label rank per test |",
        "|---|" + "---|" * (len(ks) + 1),
    ]
    for name, task in report["tasks"].items():
        ranks = ", ".join(str(t["label_rank"]) if t["label_rank"] else "-" for t in task["tests"])
        lines.append(f"| {name} | " + " | ".join(f"{task['pass_at'][k]:.2f}" for k in ks) + f" | {ranks} |")
    return "\n".join(lines) + "\n"
