"""``export --puzzle-emb external``: the puzzle-embedding table beside the graph, rows gathered on
the host from the memory-mapped ``.npy``, answers identical to the graph that embeds the table."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from hrm_deploy.errors import ArtifactError, ConfigError, DataError
from hrm_deploy.puzzle_table import PUZZLE_ROWS, Placement, PuzzleTable, table_path, write_table


def _export(checkpoint, out, **kwargs):
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx

    return export_onnx(checkpoint, out, ExportConfig(**kwargs), quiet=True)


@pytest.fixture(scope="module")
def arc_exports(tmp_path_factory):
    """The random tiny ARC model, its dataset and ``export(mode, placement)``: each export made once
    for the module with the export's parity check (the tests read them; one that edits a table
    edits a copy)."""
    from tests.arc.conftest import random_arc_model

    folder = tmp_path_factory.mktemp("arc_exports")
    checkpoint, data, _ = random_arc_model(folder)
    made = {}

    def export(mode: str = "unrolled", placement: Placement = Placement.EMBEDDED):
        if (mode, placement) not in made:
            out = folder / f"{placement.value}.{mode}.onnx"
            made[mode, placement] = _export(checkpoint, out, mode=mode, puzzle_emb=placement)
        return made[mode, placement]

    return SimpleNamespace(checkpoint=checkpoint, data=data, export=export)


def _test_feeds(data, n=12):
    from hrm_deploy.data.format import load_split

    split = load_split(data, "test")
    return {"inputs": np.asarray(split.inputs[:n]), "puzzle_identifiers": split.example_puzzle_ids()[:n]}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["unrolled", "step"])
def test_external_table_answers_like_the_embedded_one(arc_exports, mode):
    import onnx

    from hrm_deploy.backends import open_runner

    checkpoint, data = arc_exports.checkpoint, arc_exports.data
    embedded, external = arc_exports.export(mode), arc_exports.export(mode, Placement.EXTERNAL)
    assert external.parity["passed"]  # the export's own parity check ran through the gathered rows

    graph = onnx.load(external.path)
    assert [i.name for i in graph.graph.input][:2] == ["inputs", PUZZLE_ROWS]
    assert not any("puzzle_emb" in init.name for init in graph.graph.initializer)  # the table is not in the graph
    table = np.load(table_path(external.path))
    manifest = json.loads(external.manifest.read_text())
    assert manifest["puzzle_emb"]["shape"] == [17, 32] == list(table.shape)
    assert table_path(external.path).name in manifest["companions"]
    import torch

    weights = torch.load(checkpoint, map_location="cpu", weights_only=False)
    assert any(np.array_equal(table, v.numpy()) for v in _tensors(weights) if tuple(v.shape) == (17, 32))

    feeds = _test_feeds(data)
    with open_runner(embedded.path) as a, open_runner(external.path) as b:
        want, got = a.infer(feeds), b.infer(feeds)
        assert want.keys() == got.keys()
        for name in want:
            assert np.array_equal(want[name], got[name]), name
        with pytest.raises(DataError, match=r"puzzle identifier 17 is outside .*\(17 rows, identifiers 0\.\.16\)"):
            b.infer({"inputs": feeds["inputs"][:2], "puzzle_identifiers": np.array([3, 17])})
        if mode == "step":  # early halting goes through the same gathered rows
            from hrm_deploy.halting import HaltRule

            rule = HaltRule.parse("q").should_halt
            halted_a, halted_b = a.infer(feeds, halt=rule), b.infer(feeds, halt=rule)
            assert all(np.array_equal(halted_a[k], halted_b[k], equal_nan=True) for k in halted_a)


def _tensors(obj):
    """Every tensor in a checkpoint's nested dicts."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)


@pytest.mark.slow
def test_arc_eval_on_the_external_graph_scores_like_the_checkpoint(arc_exports, tmp_path):
    import shutil

    from hrm_deploy.arc.evaluate import ArcEvalConfig, arc_eval
    from hrm_deploy.manifest import manifest_path

    checkpoint, data, tmp = arc_exports.checkpoint, arc_exports.data, tmp_path
    shared = arc_exports.export(placement=Placement.EXTERNAL).path
    for file in (shared, manifest_path(shared), table_path(shared)):  # a copy: its table is edited below
        shutil.copyfile(file, tmp / file.name)
    external = SimpleNamespace(path=tmp / shared.name)
    config = ArcEvalConfig(ks=(1, 2), quiet=True)
    ref = arc_eval(checkpoint, data, tmp / "ref.json", config=config)
    got = arc_eval(external.path, data, tmp / "ext.json", config=config)
    assert got["pass_at"] == ref["pass_at"]
    assert (tmp / "ext.json").read_text() == (tmp / "ref.json").read_text()

    # the table is part of the artifact: missing or changed, the graph is refused before running
    from hrm_deploy.backends import open_runner

    table = table_path(external.path)
    original = table.read_bytes()
    changed = np.load(table)
    changed[1, 0] += 1.0
    np.save(table, changed)
    with pytest.raises(ArtifactError, match="puzzle_emb.npy .*does not match the manifest"):
        open_runner(external.path).activate()
    table.unlink()
    with pytest.raises(ArtifactError, match="missing or does not match"):
        open_runner(external.path).activate()
    table.write_bytes(original)
    open_runner(external.path).activate().close()


@pytest.mark.slow
def test_cpu_engine_of_the_external_graph_finds_the_table_of_its_parent(arc_exports, tmp_path):
    """An engine built from the external graph takes the rows too; its runner finds the table
    beside the export named as the engine's parent (tables are never copied per engine)."""
    from hrm_deploy.backends import open_runner
    from hrm_deploy.engines.build import EngineConfig, build_engine

    data, tmp = arc_exports.data, tmp_path
    embedded, external = arc_exports.export(), arc_exports.export(placement=Placement.EXTERNAL)
    engine = build_engine(external.path, EngineConfig(precision="fp32", target="cpu"), tmp / "ext.cpu.onnx", quiet=True)
    assert not table_path(engine.path).exists()
    feeds = _test_feeds(data)
    with open_runner(embedded.path) as a, open_runner(engine.path) as b:
        want, got = a.infer(feeds), b.infer(feeds)
    np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-4)
    np.testing.assert_allclose(got["q_halt_logits"], want["q_halt_logits"], atol=1e-4)

    # a graph a builder staged (no manifest yet) runs with the table of the export it came from
    import shutil

    from hrm_deploy.backends.ort.runner import OrtRunner

    staged = shutil.copyfile(engine.path, tmp / "staged.onnx")
    with pytest.raises(ArtifactError, match="no table was found"):
        OrtRunner(staged).activate()
    with OrtRunner(staged, table_of=external.path) as runner:
        assert np.array_equal(runner.infer(feeds)["logits"], got["logits"])

    # Triton's own backends cannot gather rows: triton-repo refuses the graph in one line
    from hrm_deploy.serve.repo import RepoConfig, write_triton_repo

    with pytest.raises(ArtifactError, match="hrm-deploy serve"):
        write_triton_repo([external.path], RepoConfig(output=tmp / "repo"))


def test_model_without_a_table_refuses_external(tmp_path):
    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.model.hrm import build_model

    config = HRMConfig(
        seq_len=4, vocab_size=5, num_puzzle_identifiers=1, hidden_size=16, num_heads=2, H_layers=1, L_layers=1
    )
    config = config.replace(H_cycles=1, L_cycles=1, halt_max_steps=1, expansion=2.0, puzzle_emb_ndim=0)
    checkpoint = save_checkpoint(tmp_path / "m.pt", build_model(config, seed=0))
    with pytest.raises(ConfigError, match="no puzzle-embedding table"):
        _export(checkpoint, tmp_path / "m.onnx", puzzle_emb=Placement.EXTERNAL)
    with pytest.raises(ConfigError, match="--puzzle-emb 'outside'"):
        _export(checkpoint, tmp_path / "m.onnx", puzzle_emb="outside")


def test_puzzle_table_gathers_from_the_memory_map(tmp_path):
    table = write_table(tmp_path / "t.npy", np.arange(12, dtype=np.float64).reshape(4, 3))
    assert isinstance(table.table, np.memmap) and table.table.dtype == np.float32
    rows = table.gather(np.array([3, 0, 3], np.int32))
    assert rows.flags.c_contiguous and rows.tolist() == [[9, 10, 11], [0, 1, 2], [9, 10, 11]]
    feeds = table.feeds({"inputs": np.zeros((1, 2)), "puzzle_identifiers": np.array([2])})
    assert sorted(feeds) == ["inputs", PUZZLE_ROWS] and feeds[PUZZLE_ROWS].tolist() == [[6, 7, 8]]
    for bad in (4, -1):
        with pytest.raises(DataError, match=rf"puzzle identifier {bad} is outside the puzzle-embedding table t.npy"):
            table.gather(np.array([0, bad]))
    np.save(tmp_path / "i.npy", np.zeros((2, 2), np.int64))
    with pytest.raises(ArtifactError, match="not a puzzle-embedding table"):
        PuzzleTable.load(tmp_path / "i.npy")


def test_a_table_with_a_nan_row_is_refused_at_load(tmp_path):
    """A damaged table (its hash updated to match) would answer that puzzle with garbage."""
    values = np.ones((70000, 3), np.float32)
    values[66000, 1] = np.nan  # in the second scan chunk
    np.save(tmp_path / "t.npy", values)
    with pytest.raises(ArtifactError, match="row 66000 of the puzzle-embedding table holds NaN"):
        PuzzleTable.load(tmp_path / "t.npy")
    values[66000, 1] = np.inf
    with pytest.raises(ArtifactError, match="row 66000"):
        PuzzleTable(values, "in memory")
