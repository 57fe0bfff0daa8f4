"""Weight-stripped engines refit on first run (``hrm_deploy.backends.tensorrt.refit``), driven by the fake
TensorRT on host memory: the graph's sha256 is checked first, an engine with missing weights never runs,
the whole engine is saved atomically with its own manifest and used by the next run. The build side
(flags, manifest, the refusal on TensorRT-RTX without a GPU) is in test_worker.py and test_build_strip.py."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from hrm_deploy.backends.tensorrt import fake_trt
from hrm_deploy.backends.tensorrt.api import Backend
from hrm_deploy.backends.tensorrt.refit import refitted_path
from hrm_deploy.errors import ArtifactError, EngineError
from hrm_deploy.manifest import read_manifest


@pytest.fixture(autouse=True)
def fake_backend(monkeypatch):
    import hrm_deploy.backends.tensorrt.runner as trt_runner

    monkeypatch.setattr(trt_runner, "load_backend", lambda name: Backend("tensorrt", fake_trt))
    fake_trt.CALLS.clear()


@pytest.fixture
def stripped(tmp_path):
    """(engine, graph, spec): a stripped engine in engines/ built from a graph in export/, as build-engine leaves them."""
    (tmp_path / "export").mkdir()
    (tmp_path / "engines").mkdir()
    graph = tmp_path / "export" / "m.step.fp16.onnx"
    graph.write_bytes(b"the graph the engine was built from")
    engine = tmp_path / "engines" / "m.step.fp16.engine"
    return engine, graph, fake_trt.write_stripped_engine(engine, graph, steps=3)


def run(engine, s, batch=4):
    from hrm_deploy.backends import open_runner

    rng = np.random.default_rng(0)
    x = {"inputs": rng.integers(0, s["V"], (batch, s["S"])), "puzzle_identifiers": rng.integers(0, 3, batch)}
    with open_runner(engine, memory="host") as runner:
        out = runner.infer(x)
    ref = fake_trt.reference(s, x["inputs"], x["puzzle_identifiers"])
    np.testing.assert_array_equal(out["logits"], ref["logits"])


def test_first_run_refits_saves_the_whole_engine_and_the_next_run_loads_it(stripped):
    engine, graph, s = stripped
    run(engine, s)
    assert fake_trt.CALLS["refit_from_bytes"] == 1 and fake_trt.CALLS["refit_cuda_engine"] == 1
    whole = refitted_path(engine)
    assert whole.name == "m.step.fp16.refitted.engine" and not json.loads(whole.read_bytes())["stripped"]
    manifest = read_manifest(whole)
    assert manifest["stage"] == "refit" and manifest["weights_stripped"] is False
    assert manifest["parent"]["path"] == engine.name and manifest["config"]["refit_from"]["sha256"]
    assert sorted(p.name for p in engine.parent.iterdir() if p.name.startswith(".")) == []  # no staging debris
    run(engine, s)  # the saved engine, checked against the stripped one's sha256: no second refit
    assert fake_trt.CALLS["refit_from_bytes"] == 1


def test_the_graph_copied_beside_the_engine_is_found(stripped, tmp_path):
    engine, graph, s = stripped
    os.replace(graph, engine.parent / graph.name)  # an engine and its graph shipped to a board together
    run(engine, s)
    assert refitted_path(engine).is_file()


def test_another_graph_is_refused_before_any_refit(stripped):
    engine, graph, s = stripped
    graph.write_bytes(b"an edited graph")
    with pytest.raises(ArtifactError, match="not the graph m.step.fp16.engine was built from") as error:
        run(engine, s)
    assert "\n" not in str(error.value) and fake_trt.CALLS["refit_from_bytes"] == 0
    assert not refitted_path(engine).exists()


def test_a_missing_graph_is_one_line(stripped):
    engine, graph, s = stripped
    graph.unlink()
    with pytest.raises(ArtifactError, match="copy that ONNX graph"):
        run(engine, s)


def test_missing_weights_never_run(tmp_path):
    graph = tmp_path / "g.onnx"
    graph.write_bytes(b"graph")
    engine = tmp_path / "m.engine"
    s = fake_trt.write_stripped_engine(engine, graph, steps=2)
    spec = {**json.loads(engine.read_bytes()), "forced_missing": ["lm_head.weight"]}
    engine.write_bytes(json.dumps(spec).encode())
    from hrm_deploy.manifest import update_manifest

    update_manifest(
        engine, sha256=__import__("hashlib").sha256(engine.read_bytes()).hexdigest(), size_bytes=engine.stat().st_size
    )
    with pytest.raises(EngineError, match="1 weights missing .*lm_head.weight"):
        run(engine, s)
    assert fake_trt.CALLS["executed"] == 0 and not refitted_path(engine).exists()


def test_a_folder_that_cannot_take_the_refit_still_runs(stripped, caplog, monkeypatch):
    import hrm_deploy.io

    def refused(folder, kind="stage"):
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(hrm_deploy.io, "staging_dir", refused)  # a read-only folder (as root, chmod does not bind)
    engine, graph, s = stripped
    run(engine, s)
    assert "refit again on every run" in caplog.text and not refitted_path(engine).exists()
