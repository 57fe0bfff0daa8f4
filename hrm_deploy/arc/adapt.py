"""``adapt``: teach a trained ARC checkpoint new tasks at test time, without touching it.

A task that was not in training has no puzzle-embedding row, so the model cannot answer it. ``adapt``
builds the new tasks' augmented copies (:mod:`hrm_deploy.arc.adapt_data`), appends one zero row per
copy to the checkpoint's table (upstream initialises the sparse puzzle embedding with zeros,
``CastedSparseEmbedding(..., init_std=0)``, as :class:`hrm_deploy.model.hrm.PuzzleEmbedding` does),
and trains on the copies' demonstration pairs only, with the trainer (:mod:`hrm_deploy.train.loop`:
upstream's ACT loss, the sign-SGD of the looked-up rows, the persistent carry, checkpoints, Ctrl-C
and ``--resume``). By default every weight is frozen, so only the new rows change and an
external-table export of the base answers the new tasks with the adapted table
(:mod:`hrm_deploy.arc.adapted_table`).

The output folder holds ``last.pt`` (the adapted checkpoint), ``data/`` (the new tasks in upstream's
format; its test split holds their test inputs) and ``adapt.json`` (provenance: the base's sha256,
each task file's sha256, the budget, the seed and which rows are new).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hrm_deploy.arc.adapt_data import NewTasks, build_new_tasks, check_new_names, task_refs, task_sha256
from hrm_deploy.arc.choices import AdaptTrain
from hrm_deploy.data.arc_grids import VOCAB_SIZE, grid_side
from hrm_deploy.data.format import save_dataset
from hrm_deploy.errors import ConfigError, DataError
from hrm_deploy.io import check_output_path, sha256_file, write_json
from hrm_deploy.model.checkpoint import CheckpointContents, model_from_contents, read_checkpoint
from hrm_deploy.model.hrm import build_model

if TYPE_CHECKING:
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.model.hrm import HRMACT
    from hrm_deploy.train.loop import TrainConfig

log = logging.getLogger(__name__)

RECORD = "adapt.json"  # the provenance record in the output folder
CHECKPOINT = "last.pt"
DATA = "data"
TRAIN_CHOICES = tuple(choice.value for choice in AdaptTrain)
TABLE_KEY = "puzzle_emb.weights"  # the core's state-dict key of the table [rows, puzzle_emb_ndim]


@dataclass(frozen=True)
class AdaptConfig:
    """What to adapt and how. ``steps`` and ``minutes`` bound the run (whichever ends first; the
    progress bar's ETA is for ``steps``); ``train``: ``embeddings`` (only the new rows change) or
    ``all`` (every weight too, with AdamATan2 at ``lr``). ``batch_size`` None: up to 32 copies.
    ``base_data``: the base's dataset folder, for its ``identifiers.json`` (default: the dataset
    the checkpoint records). ``replace``: adapt tasks the base already has rows for."""

    checkpoint: str
    tasks: tuple[str, ...]
    out: str
    steps: int = 200
    minutes: float | None = None
    train: str = "embeddings"
    num_aug: int = 1000
    seed: int = 0
    batch_size: int | None = None
    lr: float = 1e-4
    puzzle_emb_lr: float = 1e-2
    weight_decay: float = 0.1
    puzzle_emb_weight_decay: float = 0.1
    base_data: str | None = None
    replace: bool = False
    device: str = "auto"
    threads: int = 0
    checkpoint_minutes: float = 5.0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ConfigError(f"--steps {self.steps}: the budget must be at least 1 step")
        if self.minutes is not None and not self.minutes > 0:
            raise ConfigError(f"--minutes {self.minutes}: the budget must be more than 0 minutes")
        if self.train not in TRAIN_CHOICES:
            raise ConfigError(f"--train {self.train}: choose embeddings (only the new rows) or all (every weight)")
        if not self.tasks:
            raise ConfigError("--tasks: give ARC task JSON files or a folder of them")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"--batch-size {self.batch_size}: use 1 or more")


@dataclass
class AdaptResult:
    """The adapted checkpoint, the new tasks' dataset, the provenance record and how the run ended."""

    checkpoint: Path
    data: Path
    record: Path
    steps_done: int
    interrupted: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    main: bool = True  # rank 0 (the one that writes and reports) or the only process


def _check_arc_model(contents: CheckpointContents) -> int:
    """The canvas side of an ARC model (vocab 12, square seq_len, a puzzle-embedding table)."""
    cfg = contents.config
    if cfg.puzzle_emb_ndim <= 0:
        raise ConfigError(f"{contents.path} has no puzzle-embedding table (puzzle_emb_ndim 0); adapt needs one")
    if cfg.vocab_size != VOCAB_SIZE:
        raise ConfigError(
            f"{contents.path} has vocab {cfg.vocab_size}, not ARC's {VOCAB_SIZE}; adapt is for ARC models"
        )
    return grid_side(cfg.seq_len)


def _check_out(out: Path, base: Path, task_paths: list[Path], resume: bool) -> None:
    """OUT is new (or, with ``resume``, an adapt run's); never the base checkpoint's folder, nor inside
    the base's run folder or a task folder given with --tasks."""
    from hrm_deploy.outputs import run_folder

    check_output_path(out)
    real = out.resolve()
    run = run_folder(base)  # last.pt / step_N, or a folder holding a run's files
    inside = [(run, "the base checkpoint's run folder")] if run is not None else []
    inside += [(p, "an input task folder") for p in task_paths if p.is_dir()]
    same = [(base.parent, "the base checkpoint's folder")] + [(p.parent, "an input task folder") for p in task_paths]
    for folder, what in inside + same:
        hit = real.is_relative_to(folder.resolve()) if (folder, what) in inside else real == folder.resolve()
        if hit:
            raise ConfigError(f"-o {out} is in {what} ({folder}); adapt never writes there: choose another -o")
    if resume:
        if not (out / RECORD).is_file():
            raise ConfigError(f"--resume: {out} holds no adapt run ({RECORD} missing); start one without --resume")
    elif out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(
            f"-o {out} already exists and is not empty; continue an adapt run there with --resume, or choose another -o"
        )


def _base_identifiers(contents: CheckpointContents, base_data: str | None) -> list[str] | None:
    """The base table's identifier names: ``base_data``'s ``identifiers.json`` or the recorded
    dataset's (tried as recorded, then beside the checkpoint); None when unknown."""
    rows = contents.config.num_puzzle_identifiers
    candidates = [Path(base_data)] if base_data else _recorded_data(contents)
    for folder in candidates:
        path = folder / "identifiers.json"
        if not path.is_file():
            continue
        try:
            names = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise DataError(f"{path} is unreadable ({exc}); pass --base-data with the base's dataset") from None
        if isinstance(names, list) and len(names) == rows:
            return [str(n) for n in names]
        if base_data:
            raise DataError(
                f"--base-data {base_data}: its identifiers.json names {len(names)} puzzles but the checkpoint's "
                f"table has {rows} rows; give the dataset the checkpoint was trained on"
            )
    if base_data:
        raise DataError(f"--base-data {base_data} holds no identifiers.json; give the base's dataset folder")
    log.warning(
        "the base's puzzle identifiers are unknown (no identifiers.json of its dataset found): a new task "
        "cannot be checked against them; pass --base-data DIR to check"
    )
    return None


def _recorded_data(contents: CheckpointContents) -> list[Path]:
    """Where the dataset the checkpoint records may be: as recorded, then beside the checkpoint."""
    recorded = contents.train_config.get("data_path")
    if not isinstance(recorded, str) or not recorded:
        return []
    return [Path(recorded)] + [parent / recorded for parent in contents.path.parents]


def _check_out_of_data(out: Path, contents: CheckpointContents, base_data: str | None) -> None:
    """OUT is never inside the dataset the base was trained on (as recorded, or --base-data)."""
    real = out.resolve()
    for folder in ([Path(base_data)] if base_data else []) + _recorded_data(contents):
        if folder.is_dir() and real.is_relative_to(folder.resolve()):
            raise ConfigError(
                f"-o {out} is inside {folder}, the dataset the base checkpoint was trained on; adapt never writes "
                "there: choose another -o"
            )


def _start_model(contents: CheckpointContents, new_rows: int):
    """The base model with ``new_rows`` zero rows appended to its table (upstream's init_std=0)."""
    import torch

    base = model_from_contents(contents)
    config = dataclasses.replace(
        contents.config, num_puzzle_identifiers=contents.config.num_puzzle_identifiers + new_rows
    )
    model = build_model(config, seed=0)
    state = base.inner.state_dict()
    table = state[TABLE_KEY]
    state[TABLE_KEY] = torch.cat([table, torch.zeros(new_rows, table.shape[1], dtype=table.dtype)])
    model.inner.load_state_dict(state, strict=True)
    return model, config


def _train_config(config: AdaptConfig, out: Path, groups: int, world: int = 1) -> TrainConfig:
    """The trainer's settings; the global batch (default: up to 32 copies, a multiple of the
    process count) splits evenly over ``world`` processes, checked before anything is written."""
    from hrm_deploy.train.loop import TrainConfig

    batch = config.batch_size or max(world, min(32, groups) // world * world)
    if batch > groups:
        raise ConfigError(f"--batch-size {batch}: the new tasks have {groups} augmented copies; use at most that many")
    if batch % world:
        raise ConfigError(
            f"--batch-size {batch}: it does not split over the {world} processes; use a multiple of {world}"
        )
    return TrainConfig(
        data_path=str(out / DATA),
        out_dir=str(out),
        steps=config.steps,
        global_batch_size=batch,
        lr=config.lr,
        lr_min_ratio=1.0,
        lr_warmup_steps=0,
        weight_decay=config.weight_decay,
        puzzle_emb_lr=config.puzzle_emb_lr,
        puzzle_emb_weight_decay=config.puzzle_emb_weight_decay,
        seed=config.seed,
        checkpoint_minutes=config.checkpoint_minutes,
        eval_samples=64,
        threads=config.threads,
        device=config.device,
    )


def _record(
    config: AdaptConfig, base: Path, base_sha256: str, tasks: NewTasks, known: bool, world: int
) -> dict[str, Any]:
    return {
        "kind": "hrm-deploy adapt",
        "base": {
            "path": str(base.resolve()),
            "sha256": base_sha256,
            "rows": tasks.base_rows,
            "identifiers_known": known,
        },
        "tasks": tasks.task_sha256,
        "new_rows": {"first": tasks.base_rows, "count": tasks.new_rows},
        "train": config.train,
        "num_aug": config.num_aug,
        "seed": config.seed,
        "budget": {"steps": config.steps, "minutes": config.minutes},
        "world_size": world,  # processes that trained (torchrun), of the last start or resume
        "settings": {k: v for k, v in dataclasses.asdict(config).items() if k not in ("checkpoint", "tasks", "out")},
        "checkpoint": CHECKPOINT,
        "data": DATA,
        "status": "training",
    }


def read_record(out: str | Path) -> dict[str, Any]:
    """An adapt output folder's provenance record (``adapt.json``)."""
    path = Path(out) / RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path} is missing or unreadable ({exc}); give a folder `hrm-deploy adapt` wrote") from None
    if not isinstance(record, dict) or record.get("kind") != "hrm-deploy adapt":
        raise DataError(f"{path} is not an adapt record; give a folder `hrm-deploy adapt` wrote")
    return record


@dataclass(frozen=True)
class _Plan:
    """What every rank trains from, decided (and written to OUT) by rank 0 alone."""

    config: AdaptConfig  # on resume: the recorded settings with the budget given now
    base: Path  # the base checkpoint, resolved
    model_config: HRMConfig
    train_config: TrainConfig
    new_rows: int  # zero rows to append to the base's table (the checkpoint has them on resume)
    steps_before: int  # steps done before this run (a resumed run's record)


def _prepare(config: AdaptConfig, resume: bool, world: int) -> tuple[_Plan, dict[str, Any], HRMACT | None]:
    """Check the inputs, then write OUT's dataset and record (a new run) or read them back
    (``resume``): the plan, the record and the start model (None on resume)."""
    from hrm_deploy.sources import resolve_checkpoint

    base = resolve_checkpoint(config.checkpoint)
    out, task_paths = Path(config.out), [Path(t) for t in config.tasks]
    _check_out(out, base, task_paths, resume)
    refs = task_refs(task_paths)
    contents = read_checkpoint(base)
    _check_out_of_data(out, contents, config.base_data)
    side = _check_arc_model(contents)
    base_sha256 = sha256_file(base)
    if resume:
        record = read_record(out)
        if not (out / CHECKPOINT).is_file():
            raise ConfigError(
                f"--resume: {out} has no {CHECKPOINT} yet (the run stopped before its first checkpoint); "
                f"delete {out} and start again"
            )
        tasks_now = {ref.name: task_sha256(ref) for ref in refs}
        if record["base"]["sha256"] != base_sha256 or record["tasks"] != tasks_now:
            raise ConfigError(
                f"--resume: {out} was adapted from another base checkpoint or other tasks ({RECORD}); give the same "
                "CKPT and --tasks, or start a new run elsewhere"
            )
        settings = dict(record["settings"], steps=config.steps, minutes=config.minutes)
        config = dataclasses.replace(config, **{k: v for k, v in settings.items() if k in _FIELDS})
        train_cfg = _train_config(config, out, _train_groups(out), world)
        model_config, start, new_rows = read_checkpoint(out / CHECKPOINT).config, None, 0
        if record.get("world_size", 1) != world:
            log.info("%s was adapted with %s processes; it continues with %d", out, record.get("world_size", 1), world)
        record["world_size"] = world
    else:
        identifiers = _base_identifiers(contents, config.base_data)
        check_new_names([ref.name for ref in refs], identifiers, config.replace)
        tasks = build_new_tasks(
            refs, contents.config.num_puzzle_identifiers, identifiers, side, config.num_aug, config.seed
        )
        train_cfg = _train_config(config, out, tasks.splits["train"].metadata.total_groups, world)
        start, model_config = _start_model(contents, tasks.new_rows)
        new_rows = tasks.new_rows
        record = _record(config, base, base_sha256, tasks, identifiers is not None, world)
        out.mkdir(parents=True, exist_ok=True)
        save_dataset(out / DATA, tasks.splits, tasks.identifiers)
        if tasks.test_puzzles is not None:  # test inputs without an output: TRM's labels file scores them
            write_json(out / DATA / "test_puzzles.json", tasks.test_puzzles)
        write_json(out / RECORD, record)
    plan = _Plan(config, base, model_config, train_cfg, new_rows, int(record.get("steps_done", 0)))
    return plan, record, start


def adapt(
    config: AdaptConfig, resume: bool = False, progress: bool = True, stop_after: int | None = None
) -> AdaptResult:
    """Adapt ``config.checkpoint`` to ``config.tasks`` into ``config.out`` (or continue there with
    ``resume``); see the module's docstring. ``stop_after`` ends early after that many steps, as
    an interrupt would (tests).

    Under ``torchrun`` rank 0 alone checks the inputs and writes the dataset and the record while
    the others wait; every rank then trains its slice of each global batch as ``train`` does (the
    looked-up rows' sign-SGD gathers all ranks' gradients), rank 0 writes the checkpoints and the
    final record, and every rank returns once it is written. OUT must be on a file system every
    rank reads."""
    from hrm_deploy.train.distributed import init_distributed, on_main, shutdown
    from hrm_deploy.train.loop import train
    from hrm_deploy.train.setup import Start

    dist_info = init_distributed(config.device)
    made: dict[str, Any] = {}  # rank 0's record and start model: not sent to the other ranks

    def prepare() -> _Plan:
        plan, made["record"], made["model"] = _prepare(config, resume, dist_info.world)
        return plan

    try:
        plan = on_main(prepare, dist_info)
    except BaseException:
        shutdown(dist_info)  # every rank fails here together: leave the group cleanly
        raise
    config, out, start = plan.config, Path(plan.config.out), made.get("model")
    if not dist_info.main and not resume:  # rank 0's start: the base's weights with zero rows appended
        start = _start_model(read_checkpoint(plan.base), plan.new_rows)[0]
    deadline = time.monotonic() + 60 * config.minutes if config.minutes else None
    hooks = Start(
        model=start,
        frozen_weights=config.train == "embeddings",
        should_stop=(lambda _: time.monotonic() >= deadline) if deadline is not None else None,
    )
    result = train(
        plan.model_config,
        plan.train_config,
        resume=str(out / CHECKPOINT) if resume else None,
        stop_after=stop_after,
        progress=progress,
        start=hooks,
    )
    steps_done = int(result.metrics.get("step", plan.steps_before))  # no step run: as recorded
    if dist_info.main:
        if result.interrupted or steps_done >= config.steps:
            ended = "interrupted" if result.interrupted else "done"
        else:
            ended = "time budget" if deadline is not None and time.monotonic() >= deadline else "stopped early"
        record = made["record"]
        record.update(
            status=ended,
            steps_done=steps_done,
            checkpoint_sha256=sha256_file(result.checkpoint),
            budget={"steps": config.steps, "minutes": config.minutes},
        )
        write_json(out / RECORD, record)
    shutdown(dist_info)  # the others return once the record is written
    return AdaptResult(
        result.checkpoint,
        out / DATA,
        out / RECORD,
        steps_done,
        result.interrupted,
        result.metrics,
        dist_info.main,
    )


_FIELDS = {f.name for f in dataclasses.fields(AdaptConfig)}


def _train_groups(out: Path) -> int:
    from hrm_deploy.data.format import load_split

    return load_split(out / DATA, "train").metadata.total_groups
