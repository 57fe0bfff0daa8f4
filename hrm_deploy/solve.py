"""``solve``: run a trained HRM on your own puzzles.

Input: one Sudoku as an 81-character string (digits 1-9, ``0`` or ``.`` for blanks; spaces and
``|`` / ``-`` / ``+`` separators are ignored), a maze as lines of ``# SGo`` (wall, open, start,
goal, path), a text file with one Sudoku per line (or mazes separated by blank lines), or a
dataset folder in upstream's format (its test split, with labels). Output: per puzzle the
answer, the ACT steps used, the q_halt logit of the halting step and checks (Sudoku: rows,
columns and boxes hold 1-9 and the givens are kept; maze: walls/start/goal kept and the path
joins start to goal). Encodings are upstream's: Sudoku tokens 1 blank, 2..10 digits 1..9; maze
tokens ``# SGo`` -> 1..5; 0 pads.
"""

from __future__ import annotations

import json
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hrm_deploy.errors import ConfigError, DataError
from hrm_deploy.io import not_a_plain_file

if TYPE_CHECKING:
    from hrm_deploy.scale.cluster import RayConfig

log = logging.getLogger(__name__)

MAZE_CHARS = "# SGo"  # tokens 1..5
SUDOKU_SEPARATORS = set(" \t|+-")


class PuzzleKind(str, Enum):
    SUDOKU = "sudoku"
    MAZE = "maze"


@dataclass(frozen=True)
class Puzzle:
    """One parsed puzzle: ``tokens`` int32 [S] in upstream's encoding; ``where`` names its origin."""

    kind: PuzzleKind
    tokens: np.ndarray
    where: str
    label: np.ndarray | None = None  # tokens of the known answer (dataset folders)
    puzzle_id: int = 0


@dataclass
class Solution:
    puzzle: Puzzle
    answer: np.ndarray  # tokens [S]
    steps_used: int
    q_halt: float
    checks: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = {
            "where": self.puzzle.where,
            "kind": self.puzzle.kind.value,
            "answer": decode(self.puzzle.kind, self.answer),
            "steps_used": self.steps_used,
            "q_halt": self.q_halt,
            **self.checks,
        }
        if self.puzzle.label is not None:
            data["correct"] = bool((self.answer == self.puzzle.label).all())
        return data


# --------------------------------------------------------------------------------- parsing
def _parse_sudoku(text: str, where: str, column_offset: int = 0) -> Puzzle:
    cells: list[int] = []
    for pos, ch in enumerate(text, start=1 + column_offset):
        if ch in SUDOKU_SEPARATORS:
            continue
        if ch in "0.":
            cells.append(0)
        elif ch.isdigit():
            cells.append(int(ch))
        else:
            raise DataError(
                f"{where}, position {pos}: {ch!r} is not a Sudoku cell; use digits 1-9 for givens and "
                "0 or . for blanks (81 cells)"
            )
        if len(cells) > 81:
            raise DataError(f"{where}, position {pos}: more than 81 cells; a Sudoku has 81 (one row after another)")
    if len(cells) != 81:
        raise DataError(f"{where}: {len(cells)} cells, a Sudoku needs 81 (digits 1-9, 0 or . for blanks)")
    return Puzzle(PuzzleKind.SUDOKU, np.array(cells, np.int32) + 1, where)


def _parse_maze(lines: list[str], where: str, first_line: int) -> Puzzle:
    size = len(lines)
    for i, line in enumerate(lines):
        if len(line) != size:
            raise DataError(
                f"{where}, line {first_line + i}: {len(line)} characters, but the maze has {size} lines; "
                "a maze must be square (N lines of N characters from '# SGo')"
            )
        for pos, ch in enumerate(line, start=1):
            if ch not in MAZE_CHARS:
                raise DataError(
                    f"{where}, line {first_line + i}, position {pos}: {ch!r} is not a maze cell; "
                    "use '#' wall, ' ' open, 'S' start, 'G' goal"
                )
    flat = "".join(lines)
    if flat.count("S") != 1 or flat.count("G") != 1:
        raise DataError(
            f"{where}: a maze needs exactly one S and one G (found {flat.count('S')} and {flat.count('G')})"
        )
    return Puzzle(PuzzleKind.MAZE, np.array([MAZE_CHARS.index(c) + 1 for c in flat], np.int32), where)


def _looks_like_maze(lines: list[str]) -> bool:
    """Mazes start with a line of maze cells only (a border of walls); Sudoku lines hold digits."""
    return len(lines) > 1 and len(lines[0]) >= 5 and set(lines[0]) <= set(MAZE_CHARS) and "#" in lines[0]


def _parse_text(text: str, origin: str) -> list[Puzzle]:
    lines = text.splitlines()
    content = [line.rstrip("\r\n") for line in lines if line.strip()]
    if _looks_like_maze(content):
        puzzles: list[Puzzle] = []
        block: list[str] = []
        start = 1
        for number, line in enumerate(lines + [""], start=1):
            line = line.rstrip("\r\n")
            if line.strip():
                if not block:
                    start = number
                block.append(line)
            elif block:
                puzzles.append(_parse_maze(block, f"{origin} maze at line {start}", start))
                block = []
        return puzzles
    puzzles = []
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):  # blank lines and comments
            continue
        offset = len(line) - len(line.lstrip())
        puzzles.append(_parse_sudoku(line.strip(), f"{origin} line {number}", offset))
    if not puzzles:
        raise DataError(f"{origin} holds no puzzle; give an 81-character Sudoku per line or a maze of '# SGo' lines")
    return puzzles


def parse_puzzles(source: str | Path) -> list[Puzzle]:
    """Puzzles from a string, a text file or a dataset folder (see the module doc)."""
    text = str(source)
    path = Path(text) if "\n" not in text and len(text) < 4096 else None
    odd = not_a_plain_file(path) if path is not None else None
    if odd is not None:
        raise DataError(f"{path} is {odd}, not a text file; give a puzzle string, a text file or a dataset folder")
    if path is not None and path.is_dir():
        return _dataset_puzzles(path)
    if path is not None and path.is_file():
        try:
            content = path.read_text()
        except UnicodeDecodeError:
            raise DataError(f"{path} is not a text file; give one Sudoku per line or a maze of '# SGo' lines") from None
        return _parse_text(content, str(path))
    if "\n" not in text and len(text) < 81 and ("/" in text or text.endswith(".txt")):
        raise DataError(f"{text} does not exist; give a puzzle string, a text file or a dataset folder")
    return _parse_text(text, "puzzle")


def _dataset_puzzles(folder: Path) -> list[Puzzle]:
    from hrm_deploy.data.examples import load_examples

    examples = load_examples(folder, None, split="test")
    vocab = int(max(examples.inputs.max(), 0)) + 1
    kind = (
        PuzzleKind.SUDOKU
        if examples.inputs.shape[1] == 81 and vocab <= 11 and examples.inputs.max() > 5
        else PuzzleKind.MAZE
    )
    labels = examples.labels
    return [
        Puzzle(
            kind,
            examples.inputs[i],
            f"{folder} example {i}",
            None if labels is None else np.where(labels[i] == -100, examples.inputs[i], labels[i]).astype(np.int32),
            int(examples.puzzle_identifiers[i]),
        )
        for i in range(len(examples))
    ]


# --------------------------------------------------------------------------------- output
def decode(kind: PuzzleKind, tokens: np.ndarray) -> str:
    if kind is PuzzleKind.SUDOKU:
        return "".join(str(max(int(t) - 1, 0)) for t in tokens)
    size = math.isqrt(len(tokens))
    chars = "".join(MAZE_CHARS[int(t) - 1] if 1 <= t <= 5 else "?" for t in tokens)
    return "\n".join(chars[r * size : (r + 1) * size] for r in range(size))


def sudoku_checks(givens: np.ndarray, answer: np.ndarray) -> dict[str, Any]:
    """Rows, columns and boxes each hold 1-9; every given digit kept (tokens in upstream's encoding)."""
    grid = (answer.astype(np.int64) - 1).reshape(9, 9)
    given = (givens.astype(np.int64) - 1).reshape(9, 9)
    full = set(range(1, 10))
    rows = all(set(grid[r].tolist()) == full for r in range(9))
    cols = all(set(grid[:, c].tolist()) == full for c in range(9))
    boxes = all(set(grid[r : r + 3, c : c + 3].ravel().tolist()) == full for r in (0, 3, 6) for c in (0, 3, 6))
    kept = bool(((given == 0) | (grid == given)).all())
    return {
        "valid": bool(rows and cols and boxes and kept),
        "rows_ok": rows,
        "columns_ok": cols,
        "boxes_ok": boxes,
        "givens_kept": kept,
    }


def sudoku_solvable(givens: np.ndarray) -> bool:
    from hrm_deploy.data.sudoku import count_solutions

    return count_solutions([int(t) - 1 for t in givens], limit=1)[0] > 0


def maze_checks(puzzle: np.ndarray, answer: np.ndarray) -> dict[str, Any]:
    """Walls, start and goal kept, and the path cells (``o``) join S to G."""
    wall, start, goal, path = 1, 3, 4, 5
    size = math.isqrt(len(puzzle))
    fixed = np.isin(puzzle, (wall, start, goal))
    kept = bool((answer[fixed] == puzzle[fixed]).all())
    grid = answer.reshape(size, size)
    s = tuple(int(x) for x in np.argwhere(grid == start)[0]) if (grid == start).any() else None
    joined = False
    if s is not None:
        seen, queue = {s}, deque([s])
        while queue:
            r, c = queue.popleft()
            if grid[r, c] == goal:
                joined = True
                break
            for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
                if 0 <= nr < size and 0 <= nc < size and (nr, nc) not in seen and grid[nr, nc] in (path, goal):
                    seen.add((nr, nc))
                    queue.append((nr, nc))
    return {"valid": kept and joined, "walls_kept": kept, "path_joins": joined}


def pretty(solution: Solution) -> str:
    """The solved grid for a terminal (Sudoku with box separators), with a one-line header."""
    c = solution.checks
    state = "valid" if c.get("valid") else "NOT valid"
    if solution.puzzle.kind is PuzzleKind.SUDOKU and not c.get("solvable", True):
        state += " (the givens have no solution)"
    head = f"{solution.puzzle.where}: {solution.steps_used} ACT step(s), q_halt {solution.q_halt:+.2f}, {state}"
    if "correct" in solution.to_dict():
        head += ", matches the label" if solution.to_dict()["correct"] else ", differs from the label"
    if solution.puzzle.kind is PuzzleKind.MAZE:
        return head + "\n" + decode(PuzzleKind.MAZE, solution.answer) + "\n"
    digits = decode(PuzzleKind.SUDOKU, solution.answer)
    rows = []
    for r in range(9):
        row = digits[r * 9 : (r + 1) * 9]
        rows.append(" | ".join(" ".join(row[b * 3 : (b + 1) * 3]) for b in range(3)))
        if r in (2, 5):
            rows.append("------+-------+------")
    return head + "\n" + "\n".join(rows) + "\n"


# --------------------------------------------------------------------------------- solving
def _model_seq_len(artifact: Path) -> int | None:
    """seq_len the artifact expects, where it can be read cheaply (ONNX metadata, checkpoints)."""
    from hrm_deploy.registry import artifact_kind

    kind = artifact_kind(artifact)  # from the backend table, not the suffix
    try:
        if kind == "onnx":
            from hrm_deploy.export.metadata import graph_metadata
            from hrm_deploy.onnx_runtime import load_onnx

            return int(graph_metadata(load_onnx(artifact))["config"]["seq_len"])
        if kind == "pt2":  # a PyTorch engine: its manifest records the model config
            from hrm_deploy.runtime.artifact import read_contract

            return read_contract(artifact).seq_len
        if kind == "engine":
            return None
        from hrm_deploy.model.checkpoint import read_checkpoint

        return read_checkpoint(artifact).config.seq_len
    except (KeyError, ImportError):
        return None


def solve(
    source: str | Path,
    artifact: str | Path | None = None,
    halt: str | None = "off",
    *,
    min_steps: int = 1,
    max_steps: int | None = None,
    url: str | None = None,
    batch: int = 64,
    model_name: str = "hrm",
    calib_data: str | Path | None = None,
    quiet: bool = False,
    on_solutions: Callable[[list[Solution]], None] | None = None,
    ray: RayConfig | None = None,
    **runner_options: Any,
) -> list[Solution]:
    """Parse ``source``, run ``artifact`` (default: the bundled model) or the server at ``url``
    with the halting rule ``halt``, and check each answer. ``budget:P`` uses the threshold in
    the artifact's manifest, else calibrates it first on ``calib_data`` (default: fresh puzzles
    of the checkpoint's dataset spec, never trained on) and stores it there. More puzzles than
    one ``batch`` show a progress line with ETA on stderr unless ``quiet``. ``on_solutions`` gets
    each batch's checked answers as soon as they are computed (in order), so a caller can save
    them before the next batch runs. ``ray``: run the batches on Ray workers (:mod:`hrm_deploy.scale`),
    the answers handed over in the same order, identical to one process's."""
    from hrm_deploy.halting import HaltMode, HaltRule, resolve_rule

    puzzles = parse_puzzles(source)
    kinds = {p.kind for p in puzzles}
    seq_lens = {len(p.tokens) for p in puzzles}
    if len(kinds) > 1 or len(seq_lens) > 1:
        raise DataError("give puzzles of one kind and size per call (Sudoku and mazes cannot share a batch)")
    rule = HaltRule.parse(halt, min_steps=min_steps, max_steps=max_steps)
    inputs = np.stack([p.tokens for p in puzzles]).astype(np.int32)
    pids = np.array([p.puzzle_id for p in puzzles], np.int32)
    solutions: list[Solution] = []

    def keep(part: dict[str, Any]) -> None:  # one batch's outputs -> its checked answers, in order
        batch_solutions = _solutions(puzzles[len(solutions) :], part)
        solutions.extend(batch_solutions)
        if on_solutions is not None:
            on_solutions(batch_solutions)

    if url and ray is not None:
        raise ConfigError("--ray runs an artifact on Ray workers; a server at --url already serves it: drop --ray")
    if url:
        from hrm_deploy.serve.client import infer_remote, server_max_batch

        # never more puzzles per request than the server batches (Triton refuses them)
        size = min(batch, server_max_batch(url, model_name))
        _in_batches(lambda feeds: infer_remote(url, feeds, model_name=model_name), inputs, pids, size, keep, quiet)
    else:
        if artifact is None:
            from hrm_deploy.train.presets import bundled_checkpoint

            artifact = bundled_checkpoint()
        path = Path(artifact)
        expected = _model_seq_len(path) if path.exists() else None
        if expected is not None and expected != inputs.shape[1]:
            raise DataError(
                f"{puzzles[0].where}: a {puzzles[0].kind.value} of {inputs.shape[1]} cells, but "
                f"{path.name} expects {expected}; use a model trained on this puzzle size"
            )
        rule = resolve_rule(rule, str(path))
        if rule.mode is HaltMode.BUDGET and rule.threshold is None:
            from hrm_deploy.halting_report import prepare_rules

            [rule] = prepare_rules(
                [rule.text],
                str(path),
                None,
                min_steps=min_steps,
                max_steps=max_steps,
                calib_data=str(calib_data) if calib_data else None,
                flag="--calib-data",
                **runner_options,
            )
            from hrm_deploy.halting import calibration_cache
            from hrm_deploy.manifest import manifest_path

            where = manifest_path(path) if manifest_path(path).is_file() else calibration_cache(path)
            log.info(f"calibrated --halt {rule.text}: threshold {rule.threshold:.4g}, stored in {where}")
        if ray is not None:
            from hrm_deploy.scale.batch import solve_on_ray

            solve_on_ray(path, runner_options, rule, inputs, pids, batch, keep, ray, quiet)
        else:
            from hrm_deploy.backends import open_runner

            runner = open_runner(path, **runner_options)
            runner.activate()
            try:
                halting = {"halt": rule.should_halt} if rule.active else {}
                _in_batches(lambda feeds: runner.infer(feeds, **halting), inputs, pids, batch, keep, quiet)
            finally:
                runner.close()
    if len(solutions) < len(puzzles):  # interrupted: hand over the answers computed so far
        raise SolveInterrupted(solutions, len(puzzles))
    return solutions


class SolveInterrupted(KeyboardInterrupt):
    """Ctrl-C / SIGTERM during :func:`solve`: ``solutions`` holds the answers computed before it
    (the first ones, in order), ``total`` how many puzzles were asked."""

    def __init__(self, solutions: list[Solution], total: int):
        super().__init__(f"interrupted after {len(solutions)} of {total} puzzles")
        self.solutions, self.total = solutions, total


def _in_batches(
    infer: Any,
    inputs: np.ndarray,
    pids: np.ndarray,
    batch: int,
    keep: Callable[[dict[str, Any]], None],
    quiet: bool,
) -> None:
    """Run ``infer`` on ``batch``-sized slices, handing each result to ``keep`` in order; an
    interrupt (Ctrl-C, SIGTERM through the CLI) stops the loop and keeps what was computed."""
    from hrm_deploy.progress import progress

    try:
        with progress(len(inputs), "solving", quiet or len(inputs) <= batch, unit="puzzles") as advance:
            for s in range(0, len(inputs), batch):
                part = infer({"inputs": inputs[s : s + batch], "puzzle_identifiers": pids[s : s + batch]})
                keep(part)
                advance(len(part["logits"]))
    except KeyboardInterrupt:
        return


def _solutions(puzzles: list[Puzzle], out: dict[str, Any]) -> list[Solution]:
    """The checked solutions of the first puzzles, from one batch's outputs."""
    q_halt = np.asarray(out["q_halt_logits"], np.float32).reshape(len(out["logits"]), -1)
    steps_used = np.asarray(out.get("steps_used", np.full(len(q_halt), q_halt.shape[1], np.int32)))
    answers = np.asarray(out["logits"]).argmax(-1).astype(np.int32)
    solutions = []
    for i, puzzle in enumerate(puzzles[: len(answers)]):
        used = int(steps_used[i])
        if puzzle.kind is PuzzleKind.SUDOKU:
            checks = sudoku_checks(puzzle.tokens, answers[i])
            checks["solvable"] = checks["valid"] or sudoku_solvable(puzzle.tokens)
        else:
            checks = maze_checks(puzzle.tokens, answers[i])
        solutions.append(Solution(puzzle, answers[i], used, float(q_halt[i, used - 1]), checks))
    return solutions


def format_solutions(solutions: list[Solution], as_json: bool) -> str:
    if as_json:
        return "".join(json.dumps(s.to_dict()) + "\n" for s in solutions)
    return "\n".join(pretty(s) for s in solutions)
