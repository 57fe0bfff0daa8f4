"""No rebuild after ``adapt``: an external-table export of the base answers the new tasks with the
adapted table, exactly as the adapted checkpoint does; every mismatch is one line."""

from __future__ import annotations

import pytest

from hrm_deploy.arc.adapt import adapt
from hrm_deploy.arc.adapted_table import load_adapted_table
from hrm_deploy.errors import ArtifactError, ConfigError
from hrm_deploy.puzzle_table import Placement
from tests.arc.test_adapt import _config, new_tasks
from tests.arc.test_external_table import _export


@pytest.mark.slow
def test_external_export_of_the_base_answers_the_adapted_tasks(arc_run):
    from hrm_deploy.arc.evaluate import ArcEvalConfig, arc_eval

    checkpoint, data, tmp = arc_run
    external = _export(checkpoint, tmp / "ext.onnx", puzzle_emb=Placement.EXTERNAL, parity=False)
    result = adapt(_config(checkpoint, new_tasks(tmp / "new"), tmp / "adapted", base_data=str(data)), progress=False)
    config = ArcEvalConfig(ks=(1, 2), quiet=True)

    table = load_adapted_table(external.path, tmp / "adapted")
    assert table.rows == 17 + 8
    got = arc_eval(external.path, result.data, tmp / "ext.json", config=config, puzzle_table=table)
    want = arc_eval(result.checkpoint, result.data, tmp / "ref.json", config=config)  # the reference runner
    assert got["pass_at"] == want["pass_at"]
    assert (tmp / "ext.json").read_text() == (tmp / "ref.json").read_text()
    # the saved predictions are tied to the table: without it the new identifiers are refused
    with pytest.raises(Exception, match="puzzle identifiers go up to 24 .* has 17 rows"):
        arc_eval(external.path, result.data, tmp / "plain.json", config=config)

    # an engine built from the export takes the adapted table too (the cpu target: no TensorRT here)
    from hrm_deploy.engines.build import EngineConfig, build_engine

    engine = build_engine(external.path, EngineConfig(precision="fp32", target="cpu"), tmp / "ext.cpu.onnx", quiet=True)
    by_engine = arc_eval(
        engine.path,
        result.data,
        tmp / "eng.json",
        config=config,
        puzzle_table=load_adapted_table(engine.path, result.checkpoint),
    )
    assert by_engine["pass_at"] == want["pass_at"]

    # the checkpoint inside the folder names the same table
    assert load_adapted_table(external.path, result.checkpoint).rows == 25

    # a graph that keeps its table inside cannot take another one
    embedded = _export(checkpoint, tmp / "emb.onnx", parity=False)
    with pytest.raises(ArtifactError, match="keeps its puzzle-embedding table inside .* --puzzle-emb external"):
        load_adapted_table(embedded.path, tmp / "adapted")
    # a checkpoint has its own table
    with pytest.raises(ConfigError, match="is a checkpoint with its own table"):
        load_adapted_table(checkpoint, tmp / "adapted")
    # another run's dataset (same task names, other grids): one line, not a silently wrong score
    other = adapt(
        _config(checkpoint, new_tasks(tmp / "other", seed=9), tmp / "other-run", steps=1, base_data=str(data)),
        progress=False,
    )
    assert load_adapted_table(external.path, tmp / "adapted", result.data).rows == 25
    with pytest.raises(ConfigError, match=r"is not the dataset of the adapt run in .*test/all__inputs.npy differs"):
        load_adapted_table(external.path, tmp / "adapted", other.data)
    # a server keeps its own table
    with pytest.raises(ConfigError, match="the server at http://127.0.0.1:9 keeps its own table"):
        load_adapted_table("http://127.0.0.1:9", tmp / "adapted")
    # not an adapt output
    with pytest.raises(ConfigError, match="no adapt.json there"):
        load_adapted_table(external.path, tmp)


@pytest.mark.slow
def test_a_table_adapted_from_another_base_is_refused(arc_run):
    from hrm_deploy.model.checkpoint import load_checkpoint, save_checkpoint
    from hrm_deploy.model.hrm import build_model

    checkpoint, data, tmp = arc_run
    _, config = load_checkpoint(checkpoint)
    other = save_checkpoint(tmp / "other" / "model.pt", build_model(config, seed=1).eval())
    external = _export(other, tmp / "other.onnx", puzzle_emb=Placement.EXTERNAL, parity=False)
    tasks = new_tasks(tmp / "new")
    adapt(_config(checkpoint, tasks, tmp / "adapted", steps=1), progress=False)
    with pytest.raises(ConfigError, match=r"adapted from model.pt .* was exported from another checkpoint"):
        load_adapted_table(external.path, tmp / "adapted")
    # --train all changed the weights: the base's graph is not the adapted model
    base_graph = _export(checkpoint, tmp / "ext.onnx", puzzle_emb=Placement.EXTERNAL, parity=False)
    adapt(_config(checkpoint, tasks, tmp / "all", steps=1, train="all"), progress=False)
    with pytest.raises(ConfigError, match="--train all, which changed the model's weights"):
        load_adapted_table(base_graph.path, tmp / "all")


@pytest.mark.slow
def test_an_adapted_checkpoint_changed_after_adapt_is_refused(arc_run):
    """adapt.json records the sha256 of the checkpoint the run wrote: two new rows swapped in last.pt
    afterwards (a table that answers the wrong tasks) are refused, and so is a run that never
    finished (no sha256 recorded yet)."""
    import json

    import torch

    checkpoint, data, tmp = arc_run
    external = _export(checkpoint, tmp / "ext.onnx", puzzle_emb=Placement.EXTERNAL, parity=False)
    result = adapt(_config(checkpoint, new_tasks(tmp / "new"), tmp / "adapted", steps=1, base_data=str(data)), False)
    assert load_adapted_table(external.path, tmp / "adapted").rows == 25
    state = torch.load(result.checkpoint, map_location="cpu", weights_only=False)
    table = state["model_state"]["puzzle_emb.weights"]
    table[[17, 18]] = table[[18, 17]]  # two new tasks' rows swapped
    torch.save(state, result.checkpoint)
    with pytest.raises(ConfigError, match="is not the checkpoint the adapt run wrote"):
        load_adapted_table(external.path, tmp / "adapted")
    record = json.loads(result.record.read_text())
    record.pop("checkpoint_sha256")
    result.record.write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="has not finished"):
        load_adapted_table(external.path, tmp / "adapted")
