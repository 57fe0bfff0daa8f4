"""Answers, submissions and reports follow the artifact rule: an existing file is replaced only when
a manifest of ours names it, and nothing is written inside a dataset or run folder that is an input."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from hrm_deploy.cli import app
from hrm_deploy.errors import ArtifactError
from hrm_deploy.manifest import manifest_path
from hrm_deploy.outputs import check_user_output, publish_output
from tests.arc.conftest import arc_run  # noqa: F401 - fixture
from tests.reliability.test_never_destroy import _one_line

runner = CliRunner()
PUZZLE = "175604839462893157893751642930517264624938715751206983089175426246389571517462390"


def test_solve_never_replaces_a_users_file(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    _one_line(runner.invoke(app, ["solve", PUZZLE, "-o", str(notes)]), "hrm-deploy replaces only its own")
    assert notes.read_text() == "my notes"


def test_solve_replaces_its_own_answers(tmp_path):
    out = tmp_path / "answers.txt"
    first = runner.invoke(app, ["solve", PUZZLE, "-o", str(out)])
    assert first.exit_code == 0, first.output
    assert manifest_path(out).is_file() and out.read_text()
    again = runner.invoke(app, ["solve", PUZZLE, "-o", str(out), "--json"])
    assert again.exit_code == 0, again.output
    assert out.read_text().lstrip().startswith("{")


def test_solve_never_writes_inside_the_dataset_it_reads(tmp_path):
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    data = tmp_path / "sudoku"
    generate_sudoku(SudokuSpec(train=2, test=2, blanks=(10, 12), seed=1), str(data))
    before = sorted(p.name for p in (data / "test").iterdir())
    _one_line(runner.invoke(app, ["solve", str(data), "-o", str(data / "test" / "answers.txt")]), "an input")
    assert sorted(p.name for p in (data / "test").iterdir()) == before


def test_arc_eval_never_writes_into_the_dataset(arc_run):  # noqa: F811
    checkpoint, data, _ = arc_run
    ids = Path(data) / "identifiers.json"
    before = ids.read_bytes()
    result = runner.invoke(app, ["arc-eval", str(checkpoint), "--data", str(data), "-o", str(ids)])
    _one_line(result, "an input of this command")
    assert ids.read_bytes() == before


def test_arc_eval_never_replaces_a_users_file(arc_run, tmp_path):  # noqa: F811
    checkpoint, data, _ = arc_run
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": true}')
    result = runner.invoke(app, ["arc-eval", str(checkpoint), "--data", str(data), "-o", str(notes)])
    _one_line(result, "replaces only its own")
    assert notes.read_text() == '{"mine": true}'


def test_a_report_companion_of_someone_else_is_refused(tmp_path):
    out = tmp_path / "submission.json"
    report = tmp_path / "submission.report.json"
    report.write_text("user's")
    with pytest.raises(ArtifactError, match="did not write it"):
        check_user_output(out, companions=[report])
    publish_output(tmp_path / "other.json", "{}", stage="test", companions={tmp_path / "other.report.json": "{}"})
    # ours, with its companion named in the manifest: replaceable
    check_user_output(tmp_path / "other.json", companions=[tmp_path / "other.report.json"])


@pytest.mark.slow
def test_solve_keeps_finished_answers_through_a_kill(tmp_path):
    """kill -9 after two batches of two: the four answers computed are in <out>.partial; the next
    run refuses to start over them; a finished run leaves only <out>."""
    import signal
    import subprocess
    import sys

    puzzles = tmp_path / "p.txt"
    puzzles.write_text((PUZZLE + "\n") * 7)
    out = tmp_path / "answers.jsonl"
    script = (
        "import os, signal, sys; from pathlib import Path\n"
        "from hrm_deploy.cli.solve import PartialAnswers\n"
        "from hrm_deploy.solve import solve\n"
        "partial, seen = PartialAnswers(Path(sys.argv[2]), True), []\n"
        "def keep(s):\n"
        "    partial.append(s); seen.append(len(s))\n"
        "    if len(seen) == 2: os.kill(os.getpid(), signal.SIGKILL)\n"
        "solve(sys.argv[1], batch=2, quiet=True, on_solutions=keep)\n"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", script, str(puzzles), str(out)], cwd=root, timeout=300)
    assert done.returncode == -signal.SIGKILL
    partial = out.with_name(out.name + ".partial")
    assert len(partial.read_text().splitlines()) == 4 and not out.exists()
    _one_line(runner.invoke(app, ["solve", str(puzzles), "-o", str(out), "--json"]), "interrupted solve")
    partial.unlink()
    result = runner.invoke(app, ["solve", str(puzzles), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 7 and not partial.exists()


def test_bench_replaces_only_its_own_report_files(tiny_onnx, tmp_path):
    """bench -o: a user's report.md there is refused before any work; a bench's own files are
    replaced as one set, and a file the last run wrote that this one does not (halting.json) goes."""
    from hrm_deploy.bench.run import BenchConfig, bench
    from hrm_deploy.manifest import check_artifact

    out = tmp_path / "bench"
    out.mkdir()
    (out / "report.md").write_text("my notes")
    config = BenchConfig(
        data=tiny_onnx.data,
        batches=(1,),
        iters=1,
        warmup=0,
        accuracy_samples=4,
        out_dir=str(out),
        include_reference=False,
    )
    with pytest.raises(ArtifactError, match="did not write it"):
        bench([str(tiny_onnx.step)], config, quiet=True)
    assert (out / "report.md").read_text() == "my notes" and not (out / "report.json").exists()
    (out / "report.md").unlink()
    from dataclasses import replace

    bench([str(tiny_onnx.step)], replace(config, halt=("q",)), quiet=True)
    assert (out / "halting.json").is_file() and check_artifact(out / "report.json")
    report = bench([str(tiny_onnx.step)], config, quiet=True)
    assert not (out / "halting.json").exists() and "halting_plot" not in report
    manifest = check_artifact(out / "report.json")  # the report, its manifest and companions agree
    assert set(manifest["companions"]) <= {"report.md", "latency.png"} and "report.md" in manifest["companions"]
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # no staging debris


def test_profile_never_replaces_a_users_profile(tiny_onnx, tmp_path):
    from hrm_deploy.bench.profile import ProfileConfig, profile

    out = tmp_path / "prof"
    out.mkdir()
    (out / "profile.json").write_text('{"mine": true}')
    with pytest.raises(ArtifactError, match="replaces only its own"):
        profile([str(tiny_onnx.step)], ProfileConfig(data=tiny_onnx.data, batch=1, out_dir=str(out)))
    assert (out / "profile.json").read_text() == '{"mine": true}'


@pytest.mark.parametrize("markers", [("last.pt",), ("step_3.pt", "metrics.jsonl"), ("model.pt", ".train.lock")])
def test_solve_never_writes_into_a_trainer_run_folder_it_reads(tmp_path, markers):
    """A run folder of our trainer counts as one whatever it holds (no all_config.yaml needed)."""
    import shutil

    from hrm_deploy.cli.common import bundled_checkpoint

    run = tmp_path / "run"
    run.mkdir()
    checkpoint = run / markers[0]
    shutil.copy(bundled_checkpoint(), checkpoint)
    for extra in markers[1:]:
        (run / extra).write_text("")
    before = sorted(p.name for p in run.iterdir())
    result = runner.invoke(app, ["solve", PUZZLE, str(checkpoint), "-o", str(run / "answers.txt")])
    _one_line(result, "an input")
    assert sorted(p.name for p in run.iterdir()) == before


def test_arc_eval_of_a_trainer_checkpoint_writes_its_default_output_outside_the_run(arc_run, tmp_path, monkeypatch):  # noqa: F811
    import shutil

    checkpoint, data, _ = arc_run
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(checkpoint, run / "last.pt")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    result = runner.invoke(app, ["arc-eval", str(run / "last.pt"), "--data", str(data), "--k", "1,2"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in run.iterdir()) == ["last.pt"]  # nothing written into the run it read
    assert (here / "last.pt.arc-submission.json").is_file()
