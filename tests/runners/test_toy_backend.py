"""Adding a backend is one runner class plus one row in each table (docs/architecture.md): a toy
backend registered that way is found by suffix and runs through verify and solve, which never
name a backend."""

from __future__ import annotations

import sys
import types

import numpy as np

from hrm_deploy import artifacts, runners
from hrm_deploy.manifest import write_manifest
from hrm_deploy.runtime.base import Runner


class ToyRunner(Runner):
    """Runs a ``.toy`` artifact: the PyTorch reference of the checkpoint its manifest names."""

    name = "toy"
    supports_halt = False

    def __init__(self, path, steps=None, **options):
        from hrm_deploy.artifacts import find_reference
        from hrm_deploy.backends.reference import TorchRunner

        self.path = path
        self.inner = TorchRunner(find_reference(path), steps=steps)
        self.steps, self.calls = self.inner.steps, 0

    def _activate(self):
        self.inner.activate()
        self.steps, self.seq_len = self.inner.steps, self.inner.seq_len

    def _infer(self, feeds, halt):
        self.calls += 1
        return self.inner.infer(feeds)

    def _close(self):
        self.inner.close()


def test_a_toy_backend_is_one_class_and_one_row(trained_tiny, tmp_path, monkeypatch):
    module = types.ModuleType("toy_backend")
    module.ToyRunner = ToyRunner
    monkeypatch.setitem(sys.modules, "toy_backend", module)
    monkeypatch.setitem(runners.RUNNERS, "toy", "toy_backend:ToyRunner")
    monkeypatch.setitem(artifacts.SUFFIXES, ".toy", "toy")

    artifact = tmp_path / "tiny.toy"
    artifact.write_bytes(b"toy engine")
    write_manifest(artifact, stage="engine", config={}, parent=trained_tiny.checkpoint, precision="fp32")

    from hrm_deploy.verify import verify

    report = verify(artifact, trained_tiny.data, samples=32, quiet=True)
    assert report["runner"] == "toy" and report["passed"], report["failures"]
    assert report["logits"]["argmax_agreement"] == 1.0

    runner = runners.open_runner(artifact)
    assert isinstance(runner, ToyRunner)
    with runner:
        out = runner.infer({"inputs": np.full((2, 81), 2), "puzzle_identifiers": np.zeros(2, np.int64)})
    assert out["logits"].shape == (2, 81, 11) and runner.calls == 1
