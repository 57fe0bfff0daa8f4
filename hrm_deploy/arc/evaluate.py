"""``arc_eval``: run any artifact over an ARC dataset's test split and score it as upstream does.

Every test row runs all ACT steps (as upstream's evaluation does); its argmax prediction and final
``q_halt`` logit are appended to ``<submission>.preds.bin`` as each batch finishes, so an
interrupted run picks up where it stopped. With ``halt`` (``arc-eval --halt q``, never the
default) each row stops at its own halting step instead: its records also hold the steps it ran,
the predictions file records the rule, and the report says that halting was on (scores can
differ from the all-steps vote). Scoring (:mod:`hrm_deploy.arc.score`) then writes
``submission.json`` (ARC Prize format) and ``<submission>.report.json`` / ``.report.md``.
With ``against`` (a checkpoint) the reference is evaluated the same way and the pass@2
difference, in points, is judged against ``max_pass2_difference_points``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hrm_deploy.arc.choices import TaskScore
from hrm_deploy.arc.score import PASS_KS, Votes, labels_from_puzzles, labels_from_split, markdown, score
from hrm_deploy.arc.sources import Source, is_url, open_source
from hrm_deploy.errors import ConfigError, DataError
from hrm_deploy.io import check_output_path, write_json
from hrm_deploy.manifest import output_path
from hrm_deploy.outputs import check_user_output, publish_output, run_folder

if TYPE_CHECKING:
    from hrm_deploy.scale.cluster import RayConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArcEvalConfig:
    """How to evaluate: ``ks`` for pass@k, ``batch`` rows per call (None: the artifact's largest),
    ``task_score`` (None: TRM's fraction when the dataset has ``test_puzzles.json``, else HRM's
    all-tests rule), the pass@2 tolerance against a reference, ``restart`` to discard saved
    predictions, ``quiet`` for no progress display; for a server URL the served ``model_name``
    and the longest wait for one batch."""

    ks: tuple[int, ...] = PASS_KS
    batch: int | None = None
    task_score: TaskScore | None = None
    max_pass2_difference_points: float = 1.0
    restart: bool = False
    quiet: bool = False
    model_name: str = "hrm"
    remote_timeout_s: float = 300.0
    # run each test input's copies until its scored outcome is final (hrm_deploy.arc.early_stop):
    # the same scores and submission as the full run, fewer rows
    early_stop: bool = False
    price_per_hour: float | None = None  # the machine's price: cost per task in the report
    # per-row ACT halting (hrm_deploy.halting: q, threshold:X, budget:P): each row stops at its own
    # halting step, so scores can differ from upstream's all-steps vote; "off": every step
    halt: str = "off"
    # run the batches on Ray workers (hrm_deploy.scale): the same records and submission as one process
    ray: RayConfig | None = None

    def __post_init__(self) -> None:
        price = self.price_per_hour
        if price is not None:
            if not 0 <= price < math.inf:  # NaN and inf are no price (inf would write Infinity, not JSON)
                raise ConfigError(f"--price-per-hour {price}: give the machine's price, a finite 0 or more")
            object.__setattr__(self, "price_per_hour", price + 0.0)  # -0 is 0 (never "cost -0.000000")


def output_paths(submission: Path) -> dict[str, Path]:
    """Files written beside ``submission``: report (JSON, Markdown) and saved predictions."""
    return {
        "report_json": submission.with_suffix(".report.json"),
        "report_md": submission.with_suffix(".report.md"),
        "preds": submission.with_suffix(".preds.bin"),
        "reference_preds": submission.with_suffix(".reference-preds.bin"),
        # --early-stop: rows in the order they ran (not every row), kept apart from a full run's
        "early_preds": submission.with_suffix(".early-preds.bin"),
        "reference_early_preds": submission.with_suffix(".reference-early-preds.bin"),
    }


def _record_dtype(seq_len: int, halting: bool = False) -> np.dtype:
    """One saved row: its index, final q_halt logit, argmax tokens [S] and, with halting, its ACT steps."""
    fields = [("row", "<i8"), ("q_halt", "<f8"), ("pred", "u1", (seq_len,))]
    return np.dtype(fields + ([("steps", "<i2")] if halting else []))


def _resume(preds: Path, fingerprint: dict[str, Any], restart: bool) -> int:
    """Complete records already in ``preds`` for this artifact and dataset (0 when starting)."""
    meta_path = preds.with_suffix(".json")
    if restart or not preds.exists():
        for path in (preds, meta_path):
            if path.exists() and not path.is_symlink():
                path.unlink()
        write_json(meta_path, fingerprint)
        return 0
    try:
        saved = json.loads(meta_path.read_text())
    except (OSError, json.JSONDecodeError):
        saved = None
    if isinstance(saved, dict) and saved.get("halt", "off") != fingerprint.get("halt", "off"):
        raise ConfigError(
            f"{preds} holds predictions made with --halt {saved.get('halt', 'off')} and this run asks for --halt "
            f"{fingerprint.get('halt', 'off')}; pass --restart to discard them, or choose another --output"
        )
    if saved != fingerprint:
        raise ConfigError(
            f"{preds} holds predictions of another artifact or dataset ({meta_path.name} differs); "
            "pass --restart to discard them, or choose another --output"
        )
    record = _record_dtype(fingerprint["seq_len"], "halt" in fingerprint).itemsize
    size = preds.stat().st_size
    if size % record:  # a batch cut short by an interruption: drop its partial record
        with open(preds, "r+b") as f:
            f.truncate(size - size % record)
    return size // record


def _load_records(preds: Path, seq_len: int, any_order: bool = False, halting: bool = False) -> np.ndarray:
    """Saved records; in row order 0..n-1 (a full run) or, with ``any_order`` (an early-stopped
    run), distinct rows in the order they ran."""
    records = np.fromfile(preds, dtype=_record_dtype(seq_len, halting))
    rows = records["row"]
    ok = len(np.unique(rows)) == len(rows) if any_order else np.array_equal(rows, np.arange(len(records)))
    if not ok:
        raise DataError(f"{preds} is damaged (rows out of order or repeated); pass --restart to evaluate again")
    return records


@dataclass
class Rows:
    """What a run of :func:`predict` works on: the test split, its puzzle ids, the batch size, the record
    layout, and the rows already predicted (``done`` records, ``saved``) when it resumes."""

    split: Any
    ids: np.ndarray
    batch: int
    dtype: np.dtype
    halting: bool
    done: int
    saved: np.ndarray | None


def _rows(source: Source, data: Path, preds: Path, config: ArcEvalConfig, early: bool) -> Rows:
    """Check the dataset against ``source`` and resume (or start) ``preds``."""
    from hrm_deploy.data.format import load_split

    split = load_split(data, "test")
    meta = split.metadata
    for name, model_value in (("seq_len", source.seq_len), ("vocab_size", source.vocab_size)):
        if model_value >= 0 and getattr(meta, name) != model_value:
            raise DataError(f"{data}: dataset {name} {getattr(meta, name)} != model's {model_value}; use its dataset")
    ids = split.example_puzzle_ids()
    batch = config.batch or source.max_batch
    if batch < 1:
        raise ConfigError(f"--batch must be >= 1, got {batch}")
    check_output_path(preds)
    fingerprint = {**source.fingerprint(), "data": str(data.resolve()), "rows": len(split), "seq_len": meta.seq_len}
    fingerprint.update({"early_stop": True} if early else {})
    source.check_ids(ids, data, meta.num_puzzle_identifiers, split.inputs)
    halting = "halt" in fingerprint
    done = _resume(preds, fingerprint, config.restart)
    saved = _load_records(preds, meta.seq_len, any_order=early, halting=halting) if done else None
    return Rows(split, ids, batch, _record_dtype(meta.seq_len, halting), halting, done, saved)


def append_records(preds: Path, records: np.ndarray) -> None:
    """One batch's records at the end of ``preds``, on disk before it returns (a write cut short is
    truncated on resume)."""
    with open(preds, "ab") as f:
        f.write(records.tobytes())
        f.flush()
        os.fsync(f.fileno())


def make_records(rows: Rows, index: np.ndarray, pred: np.ndarray, q_halt: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """The records of rows ``index`` from what a source gave for them."""
    records = np.empty(len(index), rows.dtype)
    records["row"], records["q_halt"], records["pred"] = index, q_halt, pred
    if rows.halting:
        records["steps"] = steps
    return records


def predict(
    source: Source,
    data: Path,
    preds: Path,
    config: ArcEvalConfig,
    label: str,
    clock: TaskClock | None = None,
    stopper: Any = None,
) -> np.ndarray:
    """Predictions of ``source`` (an artifact or a server) on the rows of ``data``'s test split
    (records of row, final q_halt logit, argmax tokens, with halting the steps run), run or resumed
    into ``preds``; every row in order, or with ``stopper`` (an :class:`hrm_deploy.arc.early_stop.EarlyStop`)
    each test input's rows until its outcome is final. ``clock`` is charged with this run's time per task.
    With ``config.ray`` the batches run on Ray workers (:func:`hrm_deploy.scale.batch.predict_on_ray`):
    the same records, written the same way."""
    from hrm_deploy.progress import progress

    early = stopper is not None
    rows = _rows(source, data, preds, config, early)
    split, seq_len = rows.split, rows.split.metadata.seq_len
    if early:
        stopper.resume(rows.saved, rows.ids, split.inputs)
    todo = stopper.pending_rows() if early else len(split) - rows.done
    if todo and config.ray is not None:
        from hrm_deploy.scale.batch import predict_on_ray

        predict_on_ray(source, rows, preds, config, label, clock, stopper)
    elif todo:
        source.open()
        try:
            if rows.done and rows.saved is not None:
                log.info("%s: resuming after %d of %d rows", preds, rows.done, len(split))
                source.check_resumed(rows.saved, split.inputs, rows.ids)
            with progress(rows.done + todo, label, config.quiet, unit="rows", done=rows.done) as advance:
                start = rows.done
                while batch := (
                    stopper.next_batch(rows.batch) if early else list(range(start, min(start + rows.batch, len(split))))
                ):
                    start = batch[-1] + 1
                    index = np.asarray(batch, dtype=np.int64)
                    t0 = time.perf_counter()
                    pred, q_halt, steps = source.run(np.asarray(split.inputs[index]), rows.ids[index])
                    if clock is not None:
                        clock.charge(index, time.perf_counter() - t0, steps)
                    records = make_records(rows, index, pred, q_halt, steps)
                    append_records(preds, records)
                    advance(len(batch) + (stopper.add(records, rows.ids, split.inputs) if early else 0))
        finally:
            source.close()
    return _load_records(preds, seq_len, any_order=early, halting=rows.halting)


class TaskClock:
    """This run's wall time, rows and ACT steps per task: a batch's time is shared by its rows."""

    def __init__(self, row_tasks: Sequence[str | None]):
        self.row_tasks = row_tasks  # the task of each test row (None: padding)
        self.seconds: dict[str, float] = {}
        self.rows: dict[str, int] = {}
        self.steps: dict[str, int] = {}

    def charge(self, rows: np.ndarray, seconds: float, steps: np.ndarray) -> None:
        """``rows`` [B] ran in ``seconds``, each for its ``steps`` [B] ACT steps."""
        for row, used in zip(rows, steps):
            task = self.row_tasks[int(row)]
            if task is not None:
                self.rows[task] = self.rows.get(task, 0) + 1
                self.steps[task] = self.steps.get(task, 0) + int(used)
                self.seconds[task] = self.seconds.get(task, 0.0) + seconds / len(rows)

    def report(self, price_per_hour: float | None, skipped: dict[str, int]) -> dict[str, Any]:
        """Per task: wall seconds, rows run (and skipped), ACT steps run; with a price, cost; totals."""
        tasks = {}
        for task in sorted(set(self.rows) | set(skipped)):
            entry: dict[str, Any] = {
                "wall_s": round(self.seconds.get(task, 0.0), 4),
                "rows": self.rows.get(task, 0),
                "rows_skipped": skipped.get(task, 0),
                "act_steps": self.steps.get(task, 0),
            }
            if price_per_hour is not None:
                entry["cost"] = round(entry["wall_s"] / 3600 * price_per_hour, 6)
            tasks[task] = entry
        total = sum(self.seconds.values())
        summary: dict[str, Any] = {
            "tasks": tasks,
            "wall_s": round(total, 3),
            "rows": sum(self.rows.values()),
            "rows_skipped": sum(skipped.values()),
            "mean_wall_s_per_task": round(total / len(tasks), 4) if tasks else 0.0,
            "note": "this run's inference time (resumed rows not counted)",
        }
        if price_per_hour is not None:
            summary["price_per_hour"] = price_per_hour
            summary["mean_cost_per_task"] = round(total / 3600 * price_per_hour / max(1, len(tasks)), 6)
        return summary


def _labels(data: Path, config: ArcEvalConfig):
    """(test split, identifiers, labels per task, task score) of an ARC dataset folder."""
    from hrm_deploy.data.arc_tasks import read_identifiers
    from hrm_deploy.data.format import load_split

    split = load_split(data, "test")
    identifiers = read_identifiers(data)
    puzzles_path = data / "test_puzzles.json"
    if puzzles_path.is_file():  # TRM's builder: the raw test pairs
        tests = labels_from_puzzles(json.loads(puzzles_path.read_text()))
        return split, identifiers, tests, config.task_score or TaskScore.FRACTION
    # HRM's builder: the original rows of the test split
    tests = labels_from_split(identifiers, split.example_puzzle_ids(), split.inputs, split.labels)
    return split, identifiers, tests, config.task_score or TaskScore.ALL


def _score(data: Path, records: np.ndarray, config: ArcEvalConfig):
    split, identifiers, tests, task_score = _labels(data, config)
    ids = split.example_puzzle_ids()
    records = records[np.argsort(records["row"], kind="stable")]  # dataset order: upstream's tie order
    votes = Votes()
    step = 4096
    for start in range(0, len(records), step):
        chunk = records[start : start + step]
        votes.add(
            identifiers, ids[chunk["row"]], np.asarray(split.inputs[chunk["row"]]), chunk["pred"], chunk["q_halt"]
        )
    return score(tests, votes, config.ks, task_score)


def score_saved_predictions(paths: list[str | Path], data: str | Path, config: ArcEvalConfig | None = None):
    """Score upstream's own saved evaluation outputs (``torch.save`` dicts, e.g. HRM's
    ``step_N_all_preds.0``) on the dataset they were made from: ``puzzle_identifiers``,
    ``inputs``, ``q_halt_logits`` and ``preds`` (TRM) or ``logits`` (HRM, argmax taken)."""
    from hrm_deploy.errors import require

    torch = require("torch", "torch", "Reading upstream's saved predictions")
    config = config or ArcEvalConfig()
    _, identifiers, tests, task_score = _labels(Path(data), config)
    votes = Votes()
    for path in paths:
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError) as exc:
            raise DataError(f"{path} is not a readable torch.save file ({exc})") from None
        missing = [k for k in ("puzzle_identifiers", "inputs", "q_halt_logits") if k not in saved]
        if missing or ("preds" not in saved and "logits" not in saved):
            raise DataError(
                f"{path} lacks {', '.join(missing) or 'preds/logits'}; save puzzle_identifiers, inputs, "
                "q_halt_logits and preds (or logits) in upstream's eval_save_outputs"
            )
        preds = saved["preds"] if "preds" in saved else saved["logits"].argmax(-1)
        votes.add(
            identifiers,
            saved["puzzle_identifiers"].numpy(),
            saved["inputs"].numpy(),
            preds.numpy(),
            saved["q_halt_logits"].double().numpy().reshape(len(preds), -1)[:, -1],
        )
    return score(tests, votes, config.ks, task_score)


def arc_eval(
    artifact: str | Path,
    data: str | Path,
    output: str | Path | None = None,
    against: str | Path | None = None,
    config: ArcEvalConfig | None = None,
    **runner_options: Any,
) -> dict[str, Any]:
    """Evaluate ``artifact`` (checkpoint, ONNX graph, engine, or the URL of a running ``hrm-deploy
    serve``) on the ARC dataset ``data``; write ``submission.json`` (default
    ``<artifact>.arc-submission.json``, for a server ``<model>.arc-submission.json`` here) and its
    report; return the report. ``runner_options`` go to :func:`hrm_deploy.backends.open_runner`."""
    config = config or ArcEvalConfig()
    data = Path(data)
    remote = is_url(artifact)
    path = Path(f"{config.model_name}") if remote else Path(artifact)
    run = None if remote else run_folder(path)
    # beside an artifact of ours; a checkpoint's run folder is an input: its submission goes here
    default_dir = Path.cwd() if remote or run is not None else path.parent
    default_name = f"{path.name}.arc-submission.json"
    # -o NEWDIR/ (or a folder): the submission goes in it under its default name
    submission = output_path(output, default_name) if output else default_dir / default_name
    paths = output_paths(submission)
    if against is not None and 2 not in config.ks:
        raise ConfigError("--against compares pass@2: include 2 in --k")
    if not 0 <= config.max_pass2_difference_points <= 100:
        raise ConfigError(f"--max-pass2-difference {config.max_pass2_difference_points}: give points between 0 and 100")
    _check_outputs(submission, paths, [None if remote else path, against], [data, run, run_folder(against)])
    if against is not None and not remote:  # a pass@2 difference only against the model it was built from
        from hrm_deploy.provenance import check_reference

        check_reference(path, against)
    source = open_source(artifact, runner_options, config.model_name, config.remote_timeout_s, config.halt)
    clock, stopper = _work_plan(data, config)
    preds = paths["early_preds" if stopper is not None else "preds"]
    records = predict(source, data, preds, config, f"{source.name}: ARC test rows", clock, stopper)
    result = _score(data, records, config)
    report: dict[str, Any] = {"artifact": str(artifact), "data": str(data), **result.to_json()}
    skipped = stopper.skipped if stopper is not None else {}
    report["cost"] = clock.report(config.price_per_hour, skipped)
    if stopper is not None:
        report["early_stop"] = {"rows_run": len(records), "rows_skipped": sum(skipped.values())}
    halting = getattr(source, "halting", None)
    if halting is not None:
        report["halting"] = {
            "rule": halting,
            "mean_act_steps": round(float(records["steps"].mean()), 4) if len(records) else 0.0,
            "max_act_steps": int(source.contract.steps),  # type: ignore[attr-defined]
            "note": "per-row ACT halting: each row stopped at its own halting step; scores can differ from "
            "upstream's vote over all ACT steps",
        }
    if against is not None:
        reference_source = open_source(Path(against), {}, halt=config.halt)
        _, ref_stopper = _work_plan(data, config)
        ref_path = paths["reference_early_preds" if ref_stopper is not None else "reference_preds"]
        ref_records = predict(reference_source, data, ref_path, config, "PyTorch reference", None, ref_stopper)
        reference = _score(data, ref_records, config)
        difference = 100 * (result.pass_at[2] - reference.pass_at[2])
        report.update(
            reference=str(against),
            reference_pass_at={str(k): v for k, v in reference.pass_at.items()},
            pass2_difference_points=difference,
            max_pass2_difference_points=config.max_pass2_difference_points,
        )
        report["passed"] = abs(difference) <= config.max_pass2_difference_points
    publish_output(
        submission,
        json.dumps(result.submission, indent=2) + "\n",
        stage="arc-eval",
        companions={
            paths["report_json"]: json.dumps(report, indent=2, default=str) + "\n",
            paths["report_md"]: markdown(report),
        },
    )
    report["submission"] = str(submission)
    return report


def _work_plan(data: Path, config: ArcEvalConfig) -> tuple[TaskClock, Any]:
    """This run's clock (the task of each test row) and, with ``--early-stop``, its schedule."""
    split, identifiers, tests, _ = _labels(data, config)
    ids = split.example_puzzle_ids()
    from hrm_deploy.data.arc_tasks import row_tasks

    clock = TaskClock(row_tasks(identifiers, ids))
    if not config.early_stop:
        return clock, None
    from hrm_deploy.arc.early_stop import EarlyStop, row_groups

    labels: dict[tuple[str, str], list[str | None]] = {}
    for task, entries in tests.items():
        for test in entries:
            labels.setdefault((task, test.input_hash), []).append(test.label_hash)
    keys = row_groups(identifiers, ids, split.inputs)
    return clock, EarlyStop(keys, labels, config.ks, identifiers)


def _check_outputs(submission: Path, paths: dict[str, Path], inputs: list, folders: list) -> None:
    """Before any work: the submission and its reports replace only what an earlier arc-eval wrote,
    never an input, never inside the dataset or a run folder; saved predictions are reused or
    discarded only when their fingerprint file says an arc-eval wrote them."""
    reports = [paths["report_json"], paths["report_md"]]
    check_user_output(submission, inputs=inputs, folders=folders, companions=reports, flag="--output")
    for key in ("preds", "reference_preds", "early_preds", "reference_early_preds"):
        preds, meta = paths[key], paths[key].with_suffix(".json")
        if (os.path.lexists(preds) or os.path.lexists(meta)) and not _fingerprint_file(meta):
            raise ConfigError(
                f"--output {submission}: {preds.name} or {meta.name} exists and no arc-eval wrote it; "
                "move it away or choose another --output"
            )


def _fingerprint_file(meta: Path) -> bool:
    """True when ``meta`` is the fingerprint an arc-eval run writes beside its predictions."""
    try:
        saved = json.loads(meta.read_text()) if meta.is_file() and not meta.is_symlink() else None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(saved, dict) and {"data", "rows", "seq_len"} <= saved.keys()


def parse_ks(text: str) -> tuple[int, ...]:
    """``"1,2,10"`` -> (1, 2, 10)."""
    try:
        ks = tuple(int(k) for k in text.split(",") if k.strip())
    except ValueError:
        raise ConfigError(f"--k {text!r}: give comma-separated positive integers, e.g. 1,2,10") from None
    if not ks or min(ks) < 1:
        raise ConfigError(f"--k {text!r}: give comma-separated positive integers, e.g. 1,2,10")
    return ks
