"""Every bad input is one line: numeric ranges, upstream configs that
lack an architecture field, logits far off with the same argmax, reports through symlinks,
ssh options, and internal bugs reported as bugs."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from hrm_deploy.cli import app
from hrm_deploy.errors import ArtifactError, CheckpointError, ConfigError
from hrm_deploy.manifest import manifest_path, manifest_text

runner = CliRunner()


def _one_line_error(result, needle: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and needle in result.output, result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1, result.output


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["export", "--opset", "99", "-o", "x.onnx"], "--opset between"),
        (["export", "--opset", "5", "-o", "x.onnx"], "--opset between"),
        (["export", "--max-batch", "0", "-o", "x.onnx"], "--max-batch"),
        (["export", "--steps", "100000", "-o", "x.onnx"], "--steps"),
        (["build-engine", "x.onnx", "--workspace", "-5"], "--workspace"),
        (["build-engine", "x.onnx", "--opt-level", "9"], "--opt-level"),
        (["build-engine", "x.onnx", "--max-batch", "10000000"], "--max-batch"),
        (["build-engine", "x.onnx", "--int8", "--calib-samples", "0"], "--calib-samples"),
        (["bench", "--data", "d", "--batch", "100000", "--no-reference"], "--batch 100000 is too large"),
        (["bench", "--data", "d", "--batch", "0"], "batches must be >= 1"),
        (["bench", "--data", "d", "--iters", "0"], "iters >= 1"),
    ],
)
def test_numeric_options_are_validated_up_front(argv, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line_error(runner.invoke(app, argv), needle)
    assert not list(tmp_path.iterdir())  # nothing was written


def test_bench_batch_beyond_memory_is_refused_not_oom_killed(monkeypatch):
    import hrm_deploy.bench.run as run

    monkeypatch.setattr(run, "_available_memory_bytes", lambda: 2 * 2**30)
    with pytest.raises(ConfigError, match="use a batch of at most"):
        run.check_batch_memory((4096,), seq_len=82, hidden_size=512)
    run.check_batch_memory((8,), seq_len=82, hidden_size=512)


def test_verify_refuses_bad_samples_before_any_work(tiny_onnx):
    result = runner.invoke(app, ["verify", str(tiny_onnx.unrolled), "--data", tiny_onnx.data, "--samples", "-3"])
    _one_line_error(result, "--samples")


def test_a_hesitant_flip_counts_against_agreement_and_a_sure_one_fails():
    """A flipped cell differs by about its two answers' margin: closeness is judged on the cells whose
    answers agree, and a flip is excused (counted by the agreement threshold) only where the
    reference hesitated between the two answers; where it was sure, the flip fails
    (hrm_deploy.agreement; tests/test_agreement.py holds the cases on real reference outputs)."""
    from hrm_deploy.precision.registry import PRECISIONS
    from hrm_deploy.verify import compare, judge

    rng = np.random.default_rng(1)
    logits = rng.normal(size=(64, 81, 11)).astype(np.float32)
    q = rng.normal(size=(64, 4)).astype(np.float32)
    top = np.sort(logits, -1)
    hesitant = np.unravel_index(np.argmin(top[..., -1] - top[..., -2]), logits.shape[:2])
    sure = np.unravel_index(np.argmax(top[..., -1] - top[..., -2]), logits.shape[:2])
    for cell, passes in ((hesitant, True), (sure, False)):
        flipped = logits.copy()
        row = flipped[cell]
        order = np.argsort(row)[-2:]
        row[order] = row[order[::-1]]  # the answer and the runner-up swapped
        report = compare({"logits": logits, "q_halt_logits": q}, {"logits": flipped, "q_halt_logits": q}, None)
        assert report["logits"]["argmax_agreement"] < 1.0 and report["logits"]["max_rel_agreeing"] == 0.0
        failures = judge(report, PRECISIONS["int8"].thresholds)
        assert not failures if passes else any("flipped where the reference was sure" in f for f in failures)
    near = logits.copy()
    near[0, 0] += 0.7 * np.abs(logits).max()  # an agreeing cell far off still fails
    near[0, 0, logits[0, 0].argmax()] += 10.0
    report = compare({"logits": logits, "q_halt_logits": q}, {"logits": near, "q_halt_logits": q}, None)
    assert any("where the answers agree" in f for f in judge(report, PRECISIONS["int8"].thresholds))


def test_logits_far_off_fail_even_when_argmax_agrees():
    from hrm_deploy.precision.registry import PRECISIONS
    from hrm_deploy.verify import compare, judge

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(8, 81, 11)).astype(np.float32)
    q = rng.normal(size=(8, 4)).astype(np.float32)
    reference = {"logits": logits, "q_halt_logits": q}
    scaled = {"logits": logits * 2.03, "q_halt_logits": q}  # relative error ~1.03, same argmax everywhere
    report = compare(reference, scaled, None)
    assert report["logits"]["argmax_agreement"] == 1.0 and report["logits"]["max_rel"] > 1.0
    assert any("logits relative error" in f for f in judge(report, PRECISIONS["fp32"].thresholds))
    shifted_q = {"logits": logits, "q_halt_logits": q + np.sign(q) * 5}  # same sign, far off
    report = compare(reference, shifted_q, None)
    assert any("q_halt relative error" in f for f in judge(report, PRECISIONS["fp16"].thresholds))
    assert not judge(
        compare(reference, {"logits": logits + 1e-5, "q_halt_logits": q}, None), PRECISIONS["fp32"].thresholds
    )


@pytest.mark.parametrize(
    "drop,needle",
    [
        ("num_heads", "arch.num_heads"),
        ("arch", "has no arch section"),
        ("H_cycles", "arch.H_cycles"),
        ("halt_max_steps", "--halt-max-steps"),
    ],
)
def test_upstream_config_lacking_an_architecture_field_is_never_defaulted(upstream_run, drop, needle):
    from hrm_deploy.model.checkpoint import load_checkpoint

    cfg_file = upstream_run.parent / "all_config.yaml"
    data = yaml.safe_load(cfg_file.read_text())
    if drop == "arch":
        del data["arch"]
    else:
        del data["arch"][drop]
    cfg_file.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=needle) as err:
        load_checkpoint(upstream_run)
    assert "\n" not in str(err.value)
    result = runner.invoke(app, ["export", str(upstream_run), "-o", "x.onnx", "--no-parity"])
    assert result.exit_code == 2 and needle in result.output and not manifest_path("x.onnx").exists()


def test_the_missing_field_given_as_a_flag_loads_the_same_model(upstream_run, tiny_model):
    from hrm_deploy.model.checkpoint import load_checkpoint

    cfg_file = upstream_run.parent / "all_config.yaml"
    data = yaml.safe_load(cfg_file.read_text())
    del data["arch"]["num_heads"], data["arch"]["expansion"]  # expansion is inferred exactly from the weights
    cfg_file.write_text(yaml.safe_dump(data))
    _, cfg = load_checkpoint(upstream_run, num_heads=tiny_model.config.num_heads)
    # expansion only sizes the MLP; the inferred one gives the same width, so the same model
    assert cfg.intermediate_size == tiny_model.config.intermediate_size
    assert cfg.replace(expansion=tiny_model.config.expansion) == tiny_model.config


def test_a_wrong_hidden_size_is_blamed_on_hidden_size(upstream_run):
    from hrm_deploy.model.checkpoint import load_checkpoint

    cfg_file = upstream_run.parent / "all_config.yaml"
    data = yaml.safe_load(cfg_file.read_text())
    data["arch"]["hidden_size"] = 96
    cfg_file.write_text(yaml.safe_dump(data))
    with pytest.raises(CheckpointError, match="arch.hidden_size .* is 96 but the weights have hidden_size=64") as err:
        load_checkpoint(upstream_run)
    assert "expansion" not in str(err.value)


def test_reports_are_never_written_through_a_symlink_out_of_the_workspace(tiny_onnx, tmp_path, monkeypatch):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("keep me")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    shutil.copy(tiny_onnx.unrolled, work / "m.onnx")
    shutil.copy(manifest_path(tiny_onnx.unrolled), manifest_path(work / "m.onnx"))
    (work / "m.onnx.verify.md").symlink_to(victim)
    result = runner.invoke(
        app,
        [
            "verify",
            "m.onnx",
            "--data",
            tiny_onnx.data,
            "--samples",
            "4",
            "--against",
            str(__import__("hrm_deploy.artifacts").artifacts.find_reference(tiny_onnx.unrolled)),
        ],
    )
    _one_line_error(result, "outside the workspace")
    (work / "bench").symlink_to(outside, target_is_directory=True)
    result = runner.invoke(app, ["bench", "m.onnx", "--data", tiny_onnx.data, "--iters", "1", "--no-reference"])
    _one_line_error(result, "outside the workspace")
    (work / "run").mkdir()
    (work / "run" / "metrics.jsonl").symlink_to(victim)
    from hrm_deploy.io import append_line

    with pytest.raises(ArtifactError, match="outside the workspace"):
        append_line(work / "run" / "metrics.jsonl", "{}")
    assert victim.read_text() == "keep me" and sorted(p.name for p in outside.iterdir()) == ["victim.txt"]


@pytest.mark.parametrize(
    "option,ok",
    [
        ("Port=2222", True),
        ("StrictHostKeyChecking no", True),
        ("-oProxyCommand=touch /tmp/x", False),
        ("", False),
        ("Port=1\nHost *", False),
    ],
)
def test_ssh_options_are_passed_as_ssh_o(option, ok):
    from hrm_deploy.bench.remote import ssh_options

    if ok:
        assert ssh_options([option]) == ["-o", option]
    else:
        with pytest.raises(ConfigError, match="ssh_config option"):
            ssh_options([option])


def test_bench_host_uploads_nothing_a_manifest_names_without_a_matching_sha(tiny_onnx, tmp_path, monkeypatch):
    """A manifest whose parent names a file it did not come from: --host refuses before ssh runs."""
    import hrm_deploy.bench.remote as remote
    from hrm_deploy.bench.run import BenchConfig
    from hrm_deploy.manifest import read_manifest

    copy = tmp_path / "m.onnx"
    shutil.copy(tiny_onnx.unrolled, copy)
    data = read_manifest(tiny_onnx.unrolled)
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY")
    data["parent"] = {"path": str(secret), "sha256": "2" * 64}
    manifest_path(copy).write_text(manifest_text(data))  # resealed: as hrm-deploy would
    uploaded: list = []

    class FakeSsh:
        def __init__(self, *a, **k):
            pass

        def run(self, argv, check_reachable=True):
            return __import__("subprocess").CompletedProcess(argv, 0, "/tmp/r\n", "")

        def put(self, files, remote_dir):
            uploaded.extend(files)

    monkeypatch.setattr(remote, "_Ssh", FakeSsh)
    with pytest.raises(ArtifactError, match="changed since"):
        remote.bench_remote("user@host", [str(copy)], BenchConfig(data=tiny_onnx.data, accuracy_samples=4))
    assert secret not in uploaded


def test_an_internal_error_is_reported_as_a_bug_with_its_traceback(monkeypatch):
    import hrm_deploy.inspection as inspection
    from hrm_deploy.errors import HRMDeployError, InternalError

    assert not issubclass(InternalError, HRMDeployError)

    def broken(path):
        raise InternalError("the graph lost its embedding table")

    monkeypatch.setattr(inspection, "inspect_artifact", broken)
    result = runner.invoke(app, ["inspect", "x"])
    assert result.exit_code == 70
    assert "Traceback" in result.output and "this is a bug" in result.output


def test_an_explicit_path_outside_the_workspace_is_allowed_through_linked_folders(tmp_path, monkeypatch):
    """Clusters link /home -> /mnt/home: an explicit --out there is the user's choice, not an attack."""
    from hrm_deploy.io import check_output_path, write_json

    (tmp_path / "ws").mkdir()
    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "real", target_is_directory=True)
    monkeypatch.chdir(tmp_path / "ws")
    write_json(tmp_path / "linked" / "report.json", {"ok": 1})
    assert json.loads((tmp_path / "real" / "report.json").read_text()) == {"ok": 1}
    (tmp_path / "ws" / "bench").symlink_to(tmp_path / "real", target_is_directory=True)
    with pytest.raises(ArtifactError, match="outside the workspace"):
        check_output_path("bench/report.json")


@pytest.mark.parametrize("option,value", [("--min-agreement", "1.5"), ("--min-agreement", "nan"), ("--max-drop", "-1")])
def test_verify_threshold_overrides_are_range_checked_before_the_work(tiny_onnx, option, value):
    result = runner.invoke(app, ["verify", str(tiny_onnx.unrolled), "--data", tiny_onnx.data, option, value])
    _one_line_error(result, "out of range")


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda a: {**a, "labels": np.where(a["labels"] > 0, 12, a["labels"])}, "label 12 at example 0"),
        (lambda a: {**a, "inputs": a["inputs"].astype(np.float64)}, "'inputs' holds float64 values"),
        (lambda a: {**a, "inputs": a["inputs"] + 11}, "input token 1[1-9] at example 0, position 0 is outside"),
    ],
)
def test_verify_refuses_data_the_model_cannot_take(tiny_onnx, tmp_path, change, message):
    """Labels outside the vocabulary would score as silently wrong and float inputs were cast."""
    from hrm_deploy.data.format import load_split

    split = load_split(tiny_onnx.data, "test")
    arrays = {"inputs": np.asarray(split.inputs[:4]), "labels": np.asarray(split.labels[:4]).astype(np.int64)}
    np.savez(tmp_path / "d.npz", **change(arrays))
    result = runner.invoke(app, ["verify", str(tiny_onnx.unrolled), "--data", str(tmp_path / "d.npz")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    import re

    assert re.search(message, result.output), result.output


def test_an_output_ending_with_a_slash_is_a_folder(tmp_path):
    """``-o NEWDIR/`` is a folder to make (never a file named NEWDIR); where the stage has no default
    file name, or a file has that name, one line."""
    from hrm_deploy.manifest import output_path

    assert output_path(f"{tmp_path}/new/", "model.onnx") == tmp_path / "new" / "model.onnx"
    assert (tmp_path / "new").is_dir()
    with pytest.raises(ArtifactError, match="names a folder; give the output's file name"):
        output_path(f"{tmp_path}/other/", None)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArtifactError, match="is a file"):
        output_path(f"{tmp_path}/file/", "model.onnx")
    assert output_path(str(tmp_path / "plain.onnx"), "model.onnx") == tmp_path / "plain.onnx"
