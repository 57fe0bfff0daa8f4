"""An artifact and its manifest always agree, and every consumer checks it.

Real reproductions: a SIGKILL between the two renames of a unit write (test hook), a
concurrent writer replacing the file while a reader hashes it, hostile and damaged
manifests, bit-flipped and truncated files, debris of killed runs, an orphaned worker.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hrm_deploy.cli import app
from hrm_deploy.errors import ArtifactError
from hrm_deploy.io import clean_debris, staging_dir
from hrm_deploy.manifest import (
    check_artifact,
    manifest_path,
    manifest_text,
    publish_artifact,
    read_manifest,
    read_verified,
    resolve_parent,
)

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _publish(folder: Path, name: str, payload: bytes, **fields) -> Path:
    with staging_dir(folder, "export-check") as staging:
        staged = staging / name
        staged.write_bytes(payload)
        publish_artifact(staged, folder / name, stage="test", config={}, **fields)
    return folder / name


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def test_kill_between_artifact_and_manifest_never_leaves_a_lying_pair(tmp_path):
    old = _publish(tmp_path, "model.onnx", b"old 8-step graph")
    (tmp_path / "model.onnx.verify.json").write_text('{"passed": true}')
    script = textwrap.dedent(f"""
        from pathlib import Path
        from hrm_deploy.io import staging_dir
        from hrm_deploy.manifest import publish_artifact
        folder = Path({str(tmp_path)!r})
        with staging_dir(folder, "export-check") as staging:
            (staging / "model.onnx").write_bytes(b"new 2-step graph")
            publish_artifact(staging / "model.onnx", folder / "model.onnx", stage="test", config={{}})
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=_env(HRM_DEPLOY_TEST_KILL_AT="between-artifact-and-manifest"),
        timeout=60,
        capture_output=True,
    )
    assert done.returncode == -signal.SIGKILL
    assert old.read_bytes() == b"new 2-step graph"
    # the old manifest (describing the 8-step graph) and its PASSED report are gone, not beside the new graph
    assert not manifest_path(old).exists() and not (tmp_path / "model.onnx.verify.json").exists()
    with pytest.raises(ArtifactError, match="no manifest"):
        check_artifact(old, require_manifest=True)
    debris = [p for p in tmp_path.iterdir() if p.name.startswith(".export-check-")]
    assert debris, "the killed writer's staging folder is there (SIGKILL cannot be handled)"
    # a file without its manifest is never replaced (it cannot be told from a user's file): one line
    with pytest.raises(ArtifactError, match="not an hrm-deploy artifact"):
        _publish(tmp_path, "model.onnx", b"third")
    # once it is moved away, the next write in that folder removes the dead writer's debris and
    # publishes a consistent pair
    old.unlink()
    _publish(tmp_path, "model.onnx", b"third")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert check_artifact(old)["sha256"] == read_manifest(old)["sha256"]


def test_debris_of_a_live_writer_is_kept_and_of_a_dead_one_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    (tmp_path / f".model.onnx.{dead_pid}.abc123.tmp").write_bytes(b"x" * 100)
    (tmp_path / f".export-check-{dead_pid}-xyz").mkdir()
    (tmp_path / f".model.onnx.{os.getppid()}.live.tmp").write_bytes(b"in progress")
    legacy = tmp_path / ".export-check-oldstyle"
    legacy.mkdir()
    os.utime(legacy, (time.time() - 7200, time.time() - 7200))
    removed = {p.name for p in clean_debris(tmp_path)}
    assert removed == {f".model.onnx.{dead_pid}.abc123.tmp", f".export-check-{dead_pid}-xyz", ".export-check-oldstyle"}
    assert (tmp_path / f".model.onnx.{os.getppid()}.live.tmp").exists()


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda m: m.update(sha256="0" * 64), "does not match its manifest"),
        (lambda m: m.update(sha256=""), "no valid sha256"),
        (lambda m: m.pop("sha256"), "not an hrm-deploy manifest"),
    ],
)
def test_a_resealed_edited_manifest_is_still_caught(tmp_path, edit, message):
    artifact = _publish(tmp_path, "a.onnx", b"graph bytes")
    data = read_manifest(artifact)
    edit(data)
    manifest_path(artifact).write_text(manifest_text(data))  # resealed: the checks behind the seal hold
    with pytest.raises(ArtifactError, match=message):
        check_artifact(artifact)


@pytest.mark.parametrize(
    "field,value", [("precision", "bf16"), ("steps", 1), ("device", "cuda:0"), ("sha256", "0" * 64)]
)
def test_a_manifest_field_edited_by_hand_is_refused(tmp_path, field, value):
    """A hand edit of a field that changes how the artifact is judged or run (verify's tolerances by
    precision, the steps solve refuses) no longer matches the manifest's seal: one line."""
    artifact = _publish(tmp_path, "a.onnx", b"graph bytes")
    data = json.loads(manifest_path(artifact).read_text())
    data[field] = value
    manifest_path(artifact).write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="was edited after hrm-deploy wrote it"):
        check_artifact(artifact)


@pytest.mark.parametrize("tool_version", ["0.1.0", "7.3", "0.0.9", "0.0.1", None, "not a version"])
def test_a_manifest_whose_seal_was_removed_is_refused_whatever_version_it_claims(tmp_path, tool_version):
    """Deleting the seal never makes a manifest readable: every hrm-deploy release seals every
    manifest, so a manifest without one was edited, even one claiming a version from before 0.1.0
    (that claim once let an edited precision through: bf16 tolerances for an fp32 graph)."""
    artifact = _publish(tmp_path, "a.onnx", b"graph bytes")
    data = json.loads(manifest_path(artifact).read_text())
    data.pop("manifest_sha256")
    data["precision"] = "bf16"
    data["tool_version"] = tool_version
    manifest_path(artifact).write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="has no seal"):
        check_artifact(artifact)


def test_no_fixture_or_bundled_file_holds_an_unsealed_manifest():
    """Every manifest file in the repository (fixtures, bundled presets, results) is sealed, so none
    relies on the unsealed reading that is gone."""
    folders = ("hrm_deploy", "tests", "benchmarks", "scripts", "docs", "jetson")
    for path in (p for folder in folders for p in (ROOT / folder).rglob("*.manifest.json")):
        data = json.loads(path.read_text())
        assert "manifest_sha256" in data, path


@pytest.mark.parametrize(
    "content,message",
    [
        ("[1, 2, 3]", "JSON list, not an object"),
        ("\xff\xfe garbage", "not valid JSON"),
        ('"just a string"', "not an object"),
        ("[" * 100000, "not valid JSON"),
    ],
)
def test_a_manifest_that_is_not_a_json_object_is_one_line(tmp_path, content, message):
    artifact = tmp_path / "a.onnx"
    artifact.write_bytes(b"graph")
    manifest_path(artifact).write_bytes(content.encode("latin-1"))
    with pytest.raises(ArtifactError, match=message):
        check_artifact(artifact)
    result = runner.invoke(app, ["inspect", str(manifest_path(artifact))])
    assert result.exit_code == 2 and "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_inspect_of_a_json_that_is_not_a_manifest_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"lr": 0.001}')
    result = runner.invoke(app, ["inspect", str(tmp_path / "config.json")])
    assert result.exit_code == 2 and "not an hrm-deploy manifest" in result.output


def test_a_resealed_manifest_that_contradicts_its_graph_is_caught(tiny_onnx, tmp_path):
    """The seal is a checksum, not a signature: a manifest edited and resealed to say bf16 of an fp32
    graph was shown by inspect as bf16. inspect shows the contradiction instead, and the runner every
    command opens the graph with refuses it (verify would judge it by bf16's tolerances)."""
    copy = tmp_path / "tiny.onnx"
    shutil.copy(tiny_onnx.unrolled, copy)
    data = read_manifest(tiny_onnx.unrolled)
    data.update(precision="bf16", verify={"passed": True})
    manifest_path(copy).write_text(manifest_text(data))
    for target in (copy, manifest_path(copy)):
        shown = json.loads(runner.invoke(app, ["inspect", str(target)]).output)
        assert "manifest says precision bf16 but the graph itself says fp32" in shown["artifact_check"]
        assert '"passed": true' not in json.dumps(shown) and shown.get("precision") != "bf16"
        assert not (shown.get("manifest") or {}).get("precision")
    result = runner.invoke(app, ["verify", str(copy), "--data", tiny_onnx.data, "--samples", "4"])
    assert result.exit_code == 2 and "the graph itself says fp32" in result.output, result.output


def test_inspect_never_shows_an_old_pass_for_a_changed_file(tiny_onnx, tmp_path):
    copy = tmp_path / "tiny.onnx"
    shutil.copy(tiny_onnx.unrolled, copy)
    shutil.copy(manifest_path(tiny_onnx.unrolled), manifest_path(copy))
    data = read_manifest(copy)
    data["verify"] = {"passed": True}
    manifest_path(copy).write_text(manifest_text(data))  # resealed: as hrm-deploy would
    ok = runner.invoke(app, ["inspect", str(copy)])
    assert ok.exit_code == 0 and json.loads(ok.output)["artifact_check"] == "ok"
    raw = bytearray(copy.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped bit in the weights: still parses as ONNX
    copy.write_bytes(bytes(raw))
    for target in (copy, manifest_path(copy)):
        shown = json.loads(runner.invoke(app, ["inspect", str(target)]).output)
        assert "does not match its manifest" in shown["artifact_check"]
        assert '"passed": true' not in json.dumps(shown)
        assert not {"verify", "parity"} & set(shown) and not shown.get("manifest")


def test_truncated_onnx_is_one_line_everywhere(tiny_onnx, tmp_path):
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(tiny_onnx.unrolled.read_bytes()[:5000])
    for argv in (["inspect", str(cut)], ["build-engine", str(cut), "--fp32", "-o", str(tmp_path / "e.engine")]):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output and "not a readable ONNX" in result.output, result.output


def test_consumers_refuse_an_artifact_replaced_behind_its_manifest(tiny_onnx, tmp_path):
    copy = tmp_path / "tiny.onnx"
    shutil.copy(tiny_onnx.step, copy)  # the single-step graph ...
    shutil.copy(manifest_path(tiny_onnx.unrolled), manifest_path(copy))  # ... beside the unroll's manifest
    for argv in (
        ["verify", str(copy), "--data", tiny_onnx.data, "--samples", "4"],
        ["bench", str(copy), "--data", tiny_onnx.data, "--iters", "1", "--out", str(tmp_path / "b")],
        ["build-engine", str(copy), "--fp32", "-o", str(tmp_path / "e.engine")],
    ):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, (argv, result.output)
        assert "does not match its manifest" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "e.engine").exists() and not (tmp_path / "b").exists()


@pytest.mark.slow
def test_a_concurrent_writer_never_makes_a_reader_accept_other_bytes(tmp_path):
    artifact = _publish(tmp_path, "g.onnx", b"v0" * 50000)
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            _publish(tmp_path, "g.onnx", f"v{i}".encode() * 50000)

    thread = threading.Thread(target=writer)
    thread.start()
    accepted = refused = 0
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            try:
                data, manifest = read_verified(artifact)
            except ArtifactError:
                refused += 1
                continue
            if manifest is None:
                continue
            import hashlib

            assert hashlib.sha256(data).hexdigest() == manifest["sha256"]
            accepted += 1
    finally:
        stop.set()
        thread.join()
    assert accepted > 0


def test_manifest_paths_are_relative_and_checked(tmp_path, monkeypatch):
    ckpt = tmp_path / "runs" / "ckpt.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"weights")
    artifact = _publish(tmp_path / "export", "m.onnx", b"graph", parent=ckpt)
    assert read_manifest(artifact)["parent"]["path"] == "../runs/ckpt.pt"
    monkeypatch.chdir(tmp_path / "runs")  # from another folder the reference is still found
    assert resolve_parent(Path("../export/m.onnx"), read_manifest(Path("../export/m.onnx"))) is not None
    # a manifest naming a file outside, with a made-up sha256, is not followed
    secret = tmp_path / "secret.txt"
    secret.write_text("do not upload")
    data = read_manifest(artifact)
    data["parent"] = {"path": str(secret), "sha256": "1" * 64}
    manifest_path(artifact).write_text(manifest_text(data))  # resealed
    with pytest.raises(ArtifactError, match="changed since"):
        resolve_parent(artifact, read_manifest(artifact))
    data["parent"] = {"path": str(secret)}
    manifest_path(artifact).write_text(manifest_text(data))  # resealed
    with pytest.raises(ArtifactError, match="changed since"):
        resolve_parent(artifact, read_manifest(artifact))


def test_re_export_removes_the_old_verify_reports(tmp_path):
    artifact = _publish(tmp_path, "m.onnx", b"first")
    for suffix in (".verify.json", ".verify.md"):
        (tmp_path / f"m.onnx{suffix}").write_text("PASSED")
    _publish(tmp_path, "m.onnx", b"second")
    assert not (tmp_path / "m.onnx.verify.json").exists() and not (tmp_path / "m.onnx.verify.md").exists()
    assert "verify" not in read_manifest(artifact)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_killing_build_engines_parent_stops_its_worker(tmp_path):
    """The worker is started with the TensorRT builder's _die_with_parent: SIGKILL of the parent kills it."""
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        from hrm_deploy.backends.tensorrt.builder.engine import _die_with_parent
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], preexec_fn=_die_with_parent)
        open({str(pid_file)!r}, "w").write(str(child.pid))
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], env=_env())
    try:
        for _ in range(200):
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.05)
        child = int(pid_file.read_text())
        parent.kill()
        parent.wait(timeout=10)
        for _ in range(100):
            try:
                os.kill(child, 0)
                with open(f"/proc/{child}/stat") as f:
                    if f.read().split()[2] == "Z":  # zombie: dead, waiting for init to reap it
                        break
            except (ProcessLookupError, FileNotFoundError):
                break
            time.sleep(0.05)
        else:
            os.kill(child, signal.SIGKILL)
            pytest.fail("the worker outlived its parent")
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.slow
def test_sigterm_during_export_leaves_no_debris(tmp_path):
    """SIGTERM while `hrm-deploy export` is checking its staged graph: exit 130, nothing left."""
    out = tmp_path / "export"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hrm_deploy", "export", "-o", str(out / "m.onnx")],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if out.is_dir() and any(p.name.startswith(".export-check-") and any(p.iterdir()) for p in out.iterdir()):
                break
            time.sleep(0.02)
        else:
            pytest.fail(f"the export never staged a graph (rc {proc.poll()})")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == []


def test_inspect_of_a_corrupted_engine_is_its_check_not_an_old_manifest(tmp_path):
    engine = _publish(tmp_path, "m.engine", b"serialized engine" * 100, verify={"passed": True}, precision="fp16")
    shown = json.loads(runner.invoke(app, ["inspect", str(engine)]).output)
    assert shown["artifact_check"] == "ok" and shown["manifest"]["verify"]["passed"]
    engine.write_bytes(engine.read_bytes()[:100])  # truncated
    result = runner.invoke(app, ["inspect", str(engine)])
    shown = json.loads(result.output)
    assert "does not match its manifest" in shown["artifact_check"] and "manifest" not in shown


def test_an_export_landing_during_verify_gets_no_stale_verdict(tiny_onnx, tmp_path, monkeypatch):
    import hrm_deploy.verify as verify_mod
    from hrm_deploy.artifacts import find_reference

    copy = tmp_path / "m.onnx"
    shutil.copy(tiny_onnx.unrolled, copy)
    shutil.copy(manifest_path(tiny_onnx.unrolled), manifest_path(copy))
    real_run = verify_mod._run
    calls = {"n": 0}

    def run_then_export_lands(runner_, examples, batch, *display, **options):
        out = real_run(runner_, examples, batch, *display, **options)
        calls["n"] += 1
        if calls["n"] == 1:  # `hrm-deploy export -o m.onnx` finishes while verify is judging the old bytes
            fields = {
                k: v
                for k, v in read_manifest(tiny_onnx.step).items()
                if k not in ("sha256", "size_bytes", "artifact", "manifest_version", "parent", "verify")
            }
            with staging_dir(tmp_path, "export-check") as staging:
                shutil.copy(tiny_onnx.step, staging / "m.onnx")
                publish_artifact(staging / "m.onnx", copy, **fields)
        return out

    monkeypatch.setattr(verify_mod, "_run", run_then_export_lands)
    with pytest.raises(ArtifactError, match="replaced while it was being verified"):
        verify_mod.verify(copy, tiny_onnx.data, against=find_reference(tiny_onnx.unrolled), samples=4)
    assert "verify" not in read_manifest(copy) and not (tmp_path / "m.onnx.verify.md").exists()


@pytest.mark.slow
def test_a_damaged_int8_calibration_cache_is_recomputed_not_used(tiny_onnx, tmp_path):
    from hrm_deploy.precision.calibrate import QuantConfig
    from hrm_deploy.precision.convert import PrecisionConfig, make_precision_graph

    cfg = PrecisionConfig(
        "int8",
        calib_data=tiny_onnx.data,
        quant=QuantConfig(method="minmax", samples=16),
        cache_dir=str(tmp_path / "calib"),
    )
    first = make_precision_graph(tiny_onnx.unrolled, cfg, out=tmp_path / "a.int8.onnx", quiet=True)
    cache = Path(first.report["calibration"]["cache"])
    good = cache.read_bytes()
    cache.write_bytes(good[: len(good) // 3])  # as a kill during the old non-atomic write left it
    second = make_precision_graph(tiny_onnx.unrolled, cfg, out=tmp_path / "b.int8.onnx", quiet=True)
    assert cache.read_bytes() == good and second.path.read_bytes() == first.path.read_bytes()
    assert first.report["calibration"]["reused"] is False and second.report["calibration"]["reused"] is False
    assert not [p for p in cache.parent.iterdir() if p.name.endswith(".tmp")]


def test_verify_refuses_a_graph_whose_manifest_claims_another_precision(tiny_onnx, tmp_path):
    copy = tmp_path / "m.onnx"
    shutil.copy(tiny_onnx.unrolled, copy)
    data = json.loads(manifest_path(tiny_onnx.unrolled).read_text())
    data["precision"] = "bf16"  # would have judged an fp32 graph with bf16's looser tolerances
    manifest_path(copy).write_text(json.dumps(data))
    result = runner.invoke(app, ["verify", str(copy), "--data", tiny_onnx.data, "--samples", "4"])
    assert result.exit_code == 2 and "was edited after hrm-deploy wrote it" in result.output, result.output
    assert "PASSED" not in result.output
