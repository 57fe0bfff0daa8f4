"""``hrm-deploy solve``: valid, malformed and unsolvable input, files, dataset folders, mazes,
every artifact kind, halting."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import hrm_deploy
from hrm_deploy.cli import app
from hrm_deploy.errors import DataError
from hrm_deploy.solve import (
    PuzzleKind,
    maze_checks,
    parse_puzzles,
    solve,
    sudoku_checks,
)

runner = CliRunner()
# the one-step CPU fixture, named explicitly (the embedded default may be another preset)
TINY = str(Path(hrm_deploy.__file__).parent / "train" / "presets" / "sudoku-tiny.pt")
# a unique-solution puzzle with 5 blanks (the bundled model's difficulty) and its solution
PUZZLE = "175604839462893157893751642930517264624938715751206983089175426246389571517462390"
SOLVED = "175624839462893157893751642938517264624938715751246983389175426246389571517462398"


def test_solve_a_sudoku_string_pretty_and_json():
    result = runner.invoke(app, ["solve", PUZZLE, TINY])
    assert result.exit_code == 0, result.output
    assert "valid" in result.output and "1 7 5 | 6 2 4 | 8 3 9" in result.output
    default = runner.invoke(app, ["solve", PUZZLE, "--json"])  # the embedded default model
    assert default.exit_code == 0 and len(json.loads(default.stdout)["answer"]) == 81
    result = runner.invoke(app, ["solve", PUZZLE.replace("0", "."), TINY, "--json"])
    line = json.loads(result.stdout.strip())
    assert line["answer"] == SOLVED and line["valid"] and line["givens_kept"] and line["steps_used"] == 1
    assert isinstance(line["q_halt"], float)


def test_malformed_puzzles_name_line_and_position(tmp_path):
    bad = PUZZLE[:40] + "x" + PUZZLE[41:]
    result = runner.invoke(app, ["solve", bad])
    assert result.exit_code == 2 and "position 41" in result.output and "'x'" in result.output
    assert len(result.output.strip().splitlines()) == 1
    file = tmp_path / "puzzles.txt"
    file.write_text(f"{PUZZLE}\n# a comment\n{PUZZLE[:-1]}\n")
    result = runner.invoke(app, ["solve", str(file)])
    assert result.exit_code == 2 and "line 3" in result.output and "80 cells" in result.output
    with pytest.raises(DataError, match="line 2, position 3"):
        parse_puzzles("#####\n#SxG#\n#   #\n#   #\n#####")
    with pytest.raises(DataError, match="one S and one G"):
        parse_puzzles("#####\n#S  #\n#   #\n#   #\n#####")


def test_unsolvable_givens_are_reported_not_valid():
    clash = "55" + PUZZLE[2:]  # two 5s in the first row
    [solution] = solve(clash, TINY)
    assert solution.checks["solvable"] is False and solution.checks["valid"] is False
    assert solution.checks["givens_kept"] is False or solution.checks["rows_ok"] is False


def test_sudoku_checks():
    def tokens(s: str) -> np.ndarray:
        return np.array([int(c) + 1 for c in s], np.int32)

    assert sudoku_checks(tokens(PUZZLE), tokens(SOLVED))["valid"]
    swapped = SOLVED[1] + SOLVED[0] + SOLVED[2:]  # rows still fine, columns and a given broken
    checks = sudoku_checks(tokens(PUZZLE), tokens(swapped))
    assert checks["rows_ok"] and not checks["columns_ok"] and not checks["givens_kept"] and not checks["valid"]


def test_maze_parsing_and_checks(tmp_path):
    maze = "#####\n#S  #\n### #\n#G  #\n#####"
    [puzzle] = parse_puzzles(maze)
    assert puzzle.kind is PuzzleKind.MAZE and len(puzzle.tokens) == 25
    solved = "#####\n#Soo#\n###o#\n#Goo#\n#####"
    answer = parse_puzzles(solved.replace("o", "x").replace("x", "o"))  # 'o' is a valid maze char
    assert maze_checks(puzzle.tokens, answer[0].tokens)["valid"]
    assert not maze_checks(puzzle.tokens, puzzle.tokens)["path_joins"]
    file = tmp_path / "mazes.txt"
    file.write_text(maze + "\n\n" + maze + "\n")
    assert len(parse_puzzles(file)) == 2
    with pytest.raises(DataError, match="expects 81"):  # the Sudoku model cannot take a 5x5 maze
        solve(maze)


def test_solve_a_dataset_folder_from_onnx_with_halting(tiny_onnx):
    for artifact in (tiny_onnx.unrolled, tiny_onnx.step):
        solutions = solve(tiny_onnx.data, artifact, "q" if artifact == tiny_onnx.step else "off")
        rows = [s.to_dict() for s in solutions]
        assert len(rows) == 200 and all(r["steps_used"] == 1 for r in rows)
        correct = np.mean([r["correct"] for r in rows])
        assert correct >= 0.85 and np.mean([r["valid"] for r in rows]) >= correct
    with pytest.raises(Exception, match="unrolled graph"):
        solve(PUZZLE, tiny_onnx.unrolled, "q")


@pytest.mark.slow
def test_solving_more_than_a_batch_shows_progress_unless_quiet(tiny_onnx, capsys, monkeypatch):
    import itertools

    from hrm_deploy import progress as progress_mod

    clock = itertools.count(0.0, 3.0)  # every reading 3 s later: each batch is past the 5 s interval
    monkeypatch.setattr(progress_mod.time, "perf_counter", lambda: next(clock))
    assert len(solve(tiny_onnx.data, tiny_onnx.unrolled, batch=64)) == 200
    err = capsys.readouterr().err
    assert "solving: 64/200 puzzles" in err and "solving: 200/200 puzzles (100 %)" in err
    solve(tiny_onnx.data, tiny_onnx.unrolled, batch=64, quiet=True)
    solve(tiny_onnx.data, tiny_onnx.unrolled, batch=256)  # one batch: nothing to follow
    assert "solving" not in capsys.readouterr().err


def test_solve_multi_step_checkpoint_with_halting(tiny_model, tmp_path):
    from hrm_deploy.model.checkpoint import save_checkpoint

    ckpt = save_checkpoint(tmp_path / "rand.pt", tiny_model)
    off = solve(PUZZLE, ckpt)
    assert off[0].steps_used == 4
    capped = solve(PUZZLE, ckpt, "off", max_steps=2)
    assert capped[0].steps_used == 2
    # budget:P with no stored threshold and no provenance: one error naming the flag
    result = runner.invoke(app, ["solve", PUZZLE, str(ckpt), "--halt", "budget:1"])
    assert result.exit_code == 2 and "--calib-data" in result.output


@pytest.mark.slow
def test_solve_budget_calibrates_once_and_stores_it(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("HRM_DEPLOY_CACHE", str(tmp_path / "cache"))
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.manifest import manifest_path
    from hrm_deploy.model.checkpoint import save_checkpoint

    ckpt = save_checkpoint(tmp_path / "rand.pt", tiny_model)
    data = tmp_path / "calib"
    generate_sudoku(SudokuSpec(train=32, test=8, blanks=(3, 6), seed=99), str(data))
    result = runner.invoke(app, ["solve", PUZZLE, str(ckpt), "--halt", "budget:2", "--calib-data", str(data), "--json"])
    assert result.exit_code == 0, result.output
    from hrm_deploy.halting.store import stored_budgets

    assert not manifest_path(ckpt).exists()  # nothing written beside a checkpoint
    stored = stored_budgets(str(ckpt))
    assert list(stored) == ["2|min1|max0"] and stored["2|min1|max0"]["loss_points"] <= 2.0
    again = solve(PUZZLE, ckpt, "budget:2")  # the stored threshold, no data needed
    assert 1 <= again[0].steps_used <= 4
    # a threshold edited in the cache (halt at once) or made non-numeric is not trusted: one warning,
    # calibrated again from --calib-data (without it: the one-line error naming the flag)
    import json

    from hrm_deploy.halting.store import calibration_cache

    cache = calibration_cache(ckpt)
    for bad in (-1e9, "abc"):
        data_json = json.loads(cache.read_text())
        data_json["budgets"]["2|min1|max0"]["threshold"] = bad
        cache.write_text(json.dumps(data_json))
        assert stored_budgets(str(ckpt)) == {}
        result = runner.invoke(app, ["solve", PUZZLE, str(ckpt), "--halt", "budget:2"])
        assert result.exit_code == 2 and "--calib-data" in result.output and "Traceback" not in result.output
        assert "calibrating again" in result.output
    result = runner.invoke(app, ["solve", PUZZLE, str(ckpt), "--halt", "budget:2", "--calib-data", str(data), "--json"])
    assert result.exit_code == 0 and stored_budgets(str(ckpt))["2|min1|max0"] == stored["2|min1|max0"]


def test_solve_url_asks_the_server_client(monkeypatch):
    import sys
    import types

    calls = {}

    def infer_remote(url, feeds, *, model_name="hrm", timeout_s=30.0):
        calls.update(url=url, shape=feeds["inputs"].shape, model=model_name)
        logits = np.zeros((len(feeds["inputs"]), 81, 11), np.float32)
        solved = np.array([int(c) + 1 for c in SOLVED])
        logits[:, np.arange(81), solved] = 1.0
        return {
            "logits": logits,
            "q_halt_logits": np.full((len(logits), 2), 3.0, np.float32),
            "steps_used": np.full(len(logits), 2, np.int32),
        }

    client = types.ModuleType("hrm_deploy.serve.client")
    client.infer_remote = infer_remote  # type: ignore[attr-defined]
    client.server_max_batch = lambda url, model_name="hrm": 64  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "hrm_deploy.serve", types.ModuleType("hrm_deploy.serve"))
    monkeypatch.setitem(sys.modules, "hrm_deploy.serve.client", client)
    [solution] = solve(PUZZLE, url="http://localhost:8000")
    assert calls == {"url": "http://localhost:8000", "shape": (1, 81), "model": "hrm"}
    assert solution.to_dict()["answer"] == SOLVED and solution.steps_used == 2 and solution.checks["valid"]
