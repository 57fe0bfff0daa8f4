"""A verdict only against the reference an artifact was built from: every file its manifests hashed
(the checkpoint, upstream's all_config.yaml and dataset.json, a Hub snapshot's files) is checked, and
a change is one line naming the file (tests/test_verify.py: no report is replaced)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hrm_deploy.errors import ArtifactError
from hrm_deploy.manifest import write_manifest
from hrm_deploy.provenance import check_reference, reference_files
from hrm_deploy.sources import hub_origin
from tests.hub_cache import add_repo


def _artifact(folder: Path, checkpoint: Path) -> Path:
    artifact = folder / "m.onnx"
    artifact.write_bytes(b"graph")
    write_manifest(
        artifact,
        stage="export",
        config={},
        parent=checkpoint,
        hub=hub_origin(checkpoint),
        reference_files=reference_files(checkpoint),
    )
    return artifact


def test_an_edited_hub_config_is_named_before_a_verdict(tmp_path):
    add_repo(tmp_path / "hf", "acme/HRM-tiny", {"checkpoint": b"weights", "all_config.yaml": b"H_cycles: 2\n"})
    (snapshot,) = (tmp_path / "hf" / "hub" / "models--acme--HRM-tiny" / "snapshots").iterdir()
    artifact = _artifact(tmp_path, snapshot / "checkpoint")
    check_reference(artifact, snapshot / "checkpoint")  # unchanged: no word
    (snapshot / "all_config.yaml").write_text("H_cycles: 1\n")  # through the link: the blob changes
    with pytest.raises(ArtifactError, match=r"all_config.yaml changed since m.onnx was made from it"):
        check_reference(artifact, snapshot / "checkpoint")
    (snapshot / "all_config.yaml").unlink()
    with pytest.raises(ArtifactError, match=r"all_config.yaml is gone"):
        check_reference(artifact, snapshot / "checkpoint")


def test_an_upstream_runs_config_and_dataset_json_are_hashed_and_checked(tmp_path):
    run = tmp_path / "run"
    (run / "data" / "train").mkdir(parents=True)
    (run / "all_config.yaml").write_text("data_path: data\nH_cycles: 2\n")
    meta = run / "data" / "train" / "dataset.json"
    meta.write_text(json.dumps({"seq_len": 81, "vocab_size": 11}))
    step = run / "step_10"
    step.write_bytes(b"weights")
    assert set(reference_files(step)) == {"all_config.yaml", "data/train/dataset.json"}
    artifact = _artifact(tmp_path, step)
    check_reference(artifact, step)
    meta.write_text(json.dumps({"seq_len": 81, "vocab_size": 12}))
    with pytest.raises(ArtifactError, match=r"dataset.json changed since m.onnx was made from it"):
        check_reference(artifact, step)


def test_another_checkpoint_given_as_the_reference_is_refused(tmp_path):
    step = tmp_path / "step_10"
    step.write_bytes(b"weights")
    other = tmp_path / "step_20"
    other.write_bytes(b"other weights")
    artifact = _artifact(tmp_path, step)
    with pytest.raises(ArtifactError, match=r"step_20 is not the checkpoint m.onnx was made from"):
        check_reference(artifact, other)


def test_a_snapshot_file_linked_out_of_the_hub_cache_is_refused(tmp_path):
    from hrm_deploy.sources import SourceError

    add_repo(tmp_path / "hf", "acme/HRM-tiny", {"checkpoint": b"weights", "all_config.yaml": b"H_cycles: 2\n"})
    (snapshot,) = (tmp_path / "hf" / "hub" / "models--acme--HRM-tiny" / "snapshots").iterdir()
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text("H_cycles: 1\n")
    (snapshot / "all_config.yaml").unlink()
    (snapshot / "all_config.yaml").symlink_to(elsewhere)
    with pytest.raises(SourceError, match="outside the Hub cache's folder of acme/HRM-tiny"):
        hub_origin(snapshot / "checkpoint")


@pytest.mark.slow
def test_bench_checks_the_reference_it_builds_before_any_work(upstream_run, tmp_path, monkeypatch):
    """bench without --reference built its reference row from an edited all_config.yaml (and exited 0,
    minutes later); it now refuses before measuring anything, as verify does."""
    from hrm_deploy.bench.run import BenchConfig, bench
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx

    graph = export_onnx(upstream_run, tmp_path / "u.onnx", ExportConfig(parity=False), quiet=True).path
    (upstream_run.parent / "all_config.yaml").write_text(
        (upstream_run.parent / "all_config.yaml").read_text() + "# edit\n"
    )

    def measured(*args, **kwargs):
        raise AssertionError("bench measured before checking its reference")

    monkeypatch.setattr("hrm_deploy.bench.run._measure", measured)
    with pytest.raises(ArtifactError, match=r"all_config.yaml changed since u.onnx was made from it"):
        bench([graph], BenchConfig(data=str(tmp_path), out_dir=str(tmp_path / "b")), quiet=True)


@pytest.mark.slow
def test_bench_and_verify_read_the_reference_with_the_recorded_overrides(tmp_path, tiny_model, monkeypatch):
    """An export made with --seq-len (its checkpoint has no dataset.json to tell) records it; bench's
    reference row and verify's default data read it back (both ended with 'pass --seq-len N', which
    neither command has)."""
    from hrm_deploy.bench.run import BenchConfig, bench
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.errors import ConfigError
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.verify import verify
    from tests.conftest import write_upstream_run

    monkeypatch.chdir(tmp_path)
    step = write_upstream_run(tmp_path / "run", tiny_model, with_dataset=False)
    config = ExportConfig(parity=False)
    graph = export_onnx(step, tmp_path / "u.onnx", config, quiet=True, seq_len=81, vocab_size=11).path
    data = tmp_path / "data"
    generate_sudoku(SudokuSpec(train=4, test=8, blanks=(3, 6), workers=1), str(data))
    report = bench([graph], BenchConfig(data=str(data), batches=(8,), iters=1, warmup=0, out_dir=str(tmp_path / "b")))
    reference = next(row for row in report["rows"] if row.get("reference"))
    assert reference["status"] == "ok", reference
    with pytest.raises(ConfigError, match="pass --data") as refused:
        verify(graph, None, samples=4, quiet=True)
    assert "--seq-len" not in str(refused.value)
