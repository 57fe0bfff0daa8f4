"""Checkpoint and dataset sources: paths, run folders and ``hf:ORG/NAME[@REV][/PATH]`` resolved by
the real huggingface_hub against a cache in its on-disk layout (no network), and a local HTTP
server standing in for the Hub where an answer from the Hub is the point (missing repo, revision)."""

from __future__ import annotations

import hashlib
import http.server
import sys
import threading

import pytest

from hrm_deploy import sources
from hrm_deploy.errors import CheckpointError, DependencyError
from hrm_deploy.sources import SourceError, parse_hub
from tests.hub_cache import add_repo, sudoku_csv

FILES = {"checkpoint": b"weights", "all_config.yaml": b"arch: {}\n"}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An offline Hub cache under HF_HOME holding acme/tiny (a model) and acme/puzzles (a dataset)."""
    pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed (pip install 'hrm-deploy[hub]')")
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HRM_DEPLOY_CACHE", str(tmp_path / "cache"))
    commit = add_repo(home, "acme/tiny", FILES)
    data = add_repo(home, "acme/puzzles", {"train.csv": sudoku_csv(3), "test.csv": sudoku_csv(5, 1)}, "dataset")
    return home, commit, data


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("hf:org/name", ("org/name", None, None)),
        ("hf:org/name@v1.0", ("org/name", "v1.0", None)),
        ("hf:org/name/sub/step_5", ("org/name", None, "sub/step_5")),
        ("hf:org/na.me-2@main/checkpoint", ("org/na.me-2", "main", "checkpoint")),
    ],
)
def test_parse(spec, expected):
    ref = parse_hub(spec)
    assert (ref.repo_id, ref.revision, ref.path) == expected and str(ref) == spec


@pytest.mark.parametrize("spec", ["hf:name", "hf:/org/name", "hf:org/name/../x", "hf:org name/x"])
def test_parse_refuses_other_forms_in_one_line(spec):
    with pytest.raises(SourceError, match="not a Hub source; write hf:ORG/NAME"):
        parse_hub(spec)


@pytest.mark.parametrize("revision", ["", "@main", "@commit"])
def test_resolves_a_cached_checkpoint_offline(hub, revision):
    home, commit, _ = hub
    spec = "hf:acme/tiny" + revision.replace("commit", commit)
    path = sources.resolve_checkpoint(spec)
    assert path == home / "hub" / "models--acme--tiny" / "snapshots" / commit / "checkpoint"
    assert sources.resolve_checkpoint(spec + "/checkpoint") == path


def test_origin_names_repo_commit_revision_and_file_hashes(hub):
    home, commit, _ = hub
    origin = sources.hub_origin(sources.resolve_checkpoint("hf:acme/tiny"))
    assert origin == {
        "repo": "acme/tiny",
        "repo_type": "model",
        "commit": commit,
        "revision": "main",
        "refs": ["main"],
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in FILES.items()},
    }
    assert sources.hub_origin(home) is None and sources.hub_name(home / "x") is None


def _one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_offline_and_not_cached_names_the_repo_and_how_to_bring_it_in(hub):
    with pytest.raises(SourceError) as exc:
        sources.resolve_checkpoint("hf:acme/absent")
    text = _one_line(exc)
    assert "acme/absent is not in the Hugging Face cache" in text and "HF_HUB_OFFLINE is set" in text
    assert "`hf download acme/absent`" in text and "models--acme--absent" in text and "local folder" in text
    with pytest.raises(SourceError, match="hf download acme/gone --repo-type dataset"):
        sources.resolve_data("hf:acme/gone")


def test_offline_wrong_revision_names_what_the_cache_holds(hub):
    _, commit, _ = hub
    for revision in ("v2", "0" * 40):
        with pytest.raises(SourceError) as exc:
            sources.resolve_checkpoint(f"hf:acme/tiny@{revision}")
        assert f"revision {revision} of acme/tiny is not in the Hugging Face cache" in _one_line(exc)
        assert f"main ({commit[:7]})" in str(exc.value)


def test_missing_file_in_the_repo(hub):
    with pytest.raises(SourceError, match="acme/tiny has no step_9 .it holds all_config.yaml, checkpoint"):
        sources.resolve_checkpoint("hf:acme/tiny/step_9")


class _Hub(http.server.BaseHTTPRequestHandler):
    """Answers every request as the Hub does for a missing repository or revision."""

    def do_GET(self):
        code = "RevisionNotFound" if "/revision/v9" in self.path else "RepoNotFound"
        self.send_response(404)
        self.send_header("X-Error-Code", code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"error": "not found"}')

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def online(hub, monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    # huggingface_hub reads HF_HUB_OFFLINE once, at import (an earlier test may have imported it offline)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield
    server.shutdown()


@pytest.mark.slow
def test_missing_repository_on_the_hub(online):
    with pytest.raises(SourceError) as exc:
        sources.resolve_checkpoint("hf:acme/nothing-here")
    assert "no model repository acme/nothing-here on the Hugging Face Hub" in _one_line(exc)


@pytest.mark.slow
def test_wrong_revision_on_the_hub(online):
    with pytest.raises(SourceError) as exc:
        sources.resolve_checkpoint("hf:acme/other@v9")
    assert "acme/other has no revision v9" in _one_line(exc)


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    from hrm_deploy.errors import install_hint

    with pytest.raises(DependencyError) as exc:  # the command for this installation (a checkout: pip install -e)
        sources.resolve_checkpoint("hf:acme/tiny")
    assert install_hint("hub") in str(exc.value)


def test_run_folder_layouts(tmp_path):
    for name in ("step_99", "step_1000", "step_200", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    assert sources.resolve_checkpoint(tmp_path) == tmp_path / "step_1000"
    published = tmp_path / "published"
    published.mkdir()
    (published / "checkpoint").write_bytes(b"x")
    (published / "all_config.yaml").write_text("arch: {}\n")
    assert sources.resolve_checkpoint(published) == published / "checkpoint"
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no step_N file and 0 .pt files"):
        sources.resolve_checkpoint(tmp_path / "empty")


def test_hub_benchmark_is_built_once_into_the_cache(hub, monkeypatch):
    from hrm_deploy.data import benchmarks
    from hrm_deploy.data.format import load_split

    folder = benchmarks.prepare_dataset("hf:acme/puzzles", quiet=True)
    _, _, commit = hub
    assert folder.name == f"acme--puzzles-{commit[:12]}-test"
    assert len(load_split(folder, "test")) == 5 and not (folder / "train").exists()
    monkeypatch.setattr(benchmarks, "build_benchmark", None)  # a second call must not build again
    assert benchmarks.prepare_dataset("hf:acme/puzzles", quiet=True) == folder
