"""Upstream's Sudoku-Extreme and maze builders, reproduced byte for byte.

``tests/data/upstream/golden/<case>/`` holds what upstream's own ``build_sudoku_dataset.py`` /
``build_maze_dataset.py`` wrote from the CSV fixtures in ``tests/data/upstream/csv/`` (how: see
``tests/data/upstream/README.md``); every file we write must equal it byte for byte.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hrm_deploy.data.benchmarks import MazeSpec, SudokuExtremeSpec, build_benchmark
from hrm_deploy.errors import DataError

UPSTREAM = Path(__file__).parent / "upstream"
CASES = {
    "sudoku-extreme-plain": ("sudoku", SudokuExtremeSpec(seed=0)),
    "sudoku-extreme-sub20-min2-aug2": (
        "sudoku",
        SudokuExtremeSpec(subsample_size=20, min_difficulty=2, num_aug=2, seed=7),
    ),
    "maze-10x10-sub40-aug": ("maze10", MazeSpec(subsample_size=40, aug=True, seed=3)),
    "maze-30x30-plain": ("maze30", MazeSpec(seed=0)),
}


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_upstream_byte_for_byte(case, tmp_path):
    fixture, spec = CASES[case]
    out = tmp_path / case
    build_benchmark(UPSTREAM / "csv" / fixture, out, spec)
    golden, ours = _files(UPSTREAM / "golden" / case), _files(out)
    assert sorted(ours) == sorted(golden)
    different = [name for name in golden if ours[name] != golden[name]]
    assert not different, f"differs from upstream's output: {different}"


def test_augmented_sudoku_keeps_upstream_dtypes(tmp_path):
    """Upstream's quirk, kept: an augmented Sudoku train split is int64, the test split uint8."""
    splits = build_benchmark(UPSTREAM / "csv" / "sudoku", None, SudokuExtremeSpec(num_aug=1))
    assert splits["train"].inputs.dtype == np.int64 and splits["test"].inputs.dtype == np.uint8
    assert len(splits["train"]) == 2 * 50 and splits["train"].metadata.total_groups == 50


def test_seed_changes_the_augmentations():
    csv = UPSTREAM / "csv" / "sudoku"
    one = build_benchmark(csv, None, SudokuExtremeSpec(num_aug=1, seed=1))["train"].inputs
    two = build_benchmark(csv, None, SudokuExtremeSpec(num_aug=1, seed=2))["train"].inputs
    assert np.array_equal(one[::2], two[::2]) and not np.array_equal(one[1::2], two[1::2])


def test_test_split_alone(tmp_path):
    splits = build_benchmark(UPSTREAM / "csv" / "sudoku", None, SudokuExtremeSpec(splits=("test",)))
    assert list(splits) == ["test"] and len(splits["test"]) == 20


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("s,{q},{a}\n", "3 columns"),
        ("s,{q}x,{a},1\n", "81 cells"),
        ("s,{q},{a},hard\n", "rating 'hard'"),
        ("s,{bad},{a},1\n", "digits 0-9"),
    ],
)
def test_bad_sudoku_rows_are_one_line(tmp_path, row, message):
    q, a = "." * 81, "1" * 81
    (tmp_path / "test.csv").write_text("source,question,answer,rating\n" + row.format(q=q, a=a, bad="x" * 81))
    with pytest.raises(DataError, match=message):
        build_benchmark(tmp_path / "test.csv", None, SudokuExtremeSpec(min_difficulty=0))


def test_maze_alphabet_and_missing_csv(tmp_path):
    (tmp_path / "test.csv").write_text("source,question,answer,rating\ns,#X#S,#o#S,0\n")
    with pytest.raises(DataError, match="maze alphabet"):
        build_benchmark(tmp_path / "test.csv", None, MazeSpec())
    with pytest.raises(DataError, match="train.csv not found"):
        build_benchmark(tmp_path, None, MazeSpec())


def test_cli_builds_upstreams_arrays(tmp_path):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    out = tmp_path / "sudoku"
    args = ["--subsample-size", "20", "--min-difficulty", "2", "--num-aug", "2", "--seed", "7", "-q"]
    result = CliRunner().invoke(
        app, ["data", "sudoku-extreme", "-o", str(out), "--source", str(UPSTREAM / "csv" / "sudoku"), *args]
    )
    assert result.exit_code == 0, result.output
    assert _files(out) == _files(UPSTREAM / "golden" / "sudoku-extreme-sub20-min2-aug2")


def test_cli_builds_a_hub_benchmark(tmp_path, monkeypatch):
    """``--source hf:...`` (the default's form): the real huggingface_hub resolves it from a cache."""
    pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed (pip install 'hrm-deploy[hub]')")
    from typer.testing import CliRunner

    from hrm_deploy.cli import app
    from tests.hub_cache import add_repo

    csv = UPSTREAM / "csv" / "maze10"
    files = {f"{s}.csv": (csv / f"{s}.csv").read_bytes() for s in ("train", "test")}
    add_repo(tmp_path / "hf", "sapientinc/maze-30x30-hard-1k", files, "dataset")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "maze"
    args = ["--subsample-size", "40", "--aug", "--seed", "3", "-q"]
    result = CliRunner().invoke(app, ["data", "maze-30x30-hard", "-o", str(out), *args])
    assert result.exit_code == 0, result.output
    assert _files(out) == _files(UPSTREAM / "golden" / "maze-10x10-sub40-aug")
