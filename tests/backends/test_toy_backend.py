"""Adding a backend is one package (a runner class, optionally a builder) plus one row in the
backend table (docs/architecture.md): a toy backend registered that way is built by build_engine
and found by suffix by verify, which never name a backend."""

from __future__ import annotations

import sys
import types

import numpy as np

from hrm_deploy import backends, registry
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


def build_toy(request):
    """The toy build: an 'engine' that names its checkpoint in its manifest."""
    from hrm_deploy.engines.result import EngineResult

    out, source = request.out, request.ready
    write_manifest(out.write_bytes(b"toy engine") and out, stage="engine", config={}, parent=source, precision="fp32")
    return EngineResult(out, out.with_name(out.name + ".manifest.json"), source)


def test_a_toy_backend_is_one_package_and_one_row(trained_tiny, tmp_path, monkeypatch):
    module = types.ModuleType("toy_backend")
    from hrm_deploy.engines.request import GraphInput, SimpleBuilder

    # the toy builder takes what was given (here a checkpoint), through the one Builder protocol
    module.ToyRunner, module.BUILDER = ToyRunner, SimpleBuilder(build_toy, GraphInput.SOURCE)
    monkeypatch.setitem(sys.modules, "toy_backend", module)
    row = registry.BackendEntry("toy", "toy_backend:ToyRunner", (".toy",), "toy_backend:BUILDER", ("toy",))
    monkeypatch.setitem(registry.BACKENDS, "toy", row)

    from hrm_deploy.engines.build import EngineConfig, build_engine

    artifact = tmp_path / "tiny.toy"
    built = build_engine(trained_tiny.checkpoint, EngineConfig("fp32", backend="toy"), artifact, quiet=True)
    assert built.path == artifact and artifact.read_bytes() == b"toy engine"

    from hrm_deploy.verify import verify

    report = verify(artifact, trained_tiny.data, samples=32, quiet=True)
    assert report["runner"] == "toy" and report["passed"], report["failures"]
    assert report["logits"]["argmax_agreement"] == 1.0

    runner = backends.open_runner(artifact)
    assert isinstance(runner, ToyRunner)
    with runner:
        out = runner.infer({"inputs": np.full((2, 81), 2), "puzzle_identifiers": np.zeros(2, np.int64)})
    assert out["logits"].shape == (2, 81, 11) and runner.calls == 1


def test_runner_options_come_from_the_row_not_the_suffix(monkeypatch, tmp_path):
    """A stage offers its options (--provider, --threads); each backend's row says which it takes."""
    row = registry.BackendEntry("toy", "toy_backend:ToyRunner", (".toy",), options=("color",))
    monkeypatch.setitem(registry.BACKENDS, "toy", row)
    offered = {"provider": "cuda", "threads": None, "color": "red"}
    assert registry.runner_options(tmp_path / "m.onnx", **offered) == {"provider": "cuda"}
    assert registry.runner_options(tmp_path / "m.toy", **offered) == {"color": "red"}
    assert registry.runner_options(tmp_path / "m.engine", **offered) == {}
    assert registry.runner_options(tmp_path / "step_100", **offered) == {}  # a checkpoint
