import json

import numpy as np
import onnx
import pytest
import torch

from hrm_deploy.errors import ConfigError, ParityError
from hrm_deploy.export import parity as parity_mod
from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
from hrm_deploy.export.parity import sample_inputs
from hrm_deploy.export.unroll import unroll
from hrm_deploy.manifest import read_manifest
from hrm_deploy.onnx_runtime import ort_session, run_stepwise


@pytest.fixture(scope="module")
def tiny_unrolled(tmp_path_factory):
    """The tiny model's unrolled export with per-step answers (parity checked), read by the tests below."""
    from tests.conftest import make_tiny_model

    model = make_tiny_model()
    out = tmp_path_factory.mktemp("unrolled") / "tiny.onnx"
    return model, out, export_onnx(model, out, ExportConfig(step_predictions=True, max_batch=8), quiet=True)


@pytest.mark.slow
def test_unrolled_export_contract_and_parity(tiny_unrolled):
    _, out, result = tiny_unrolled
    model = onnx.load(out)
    names = [i.name for i in model.graph.input], [o.name for o in model.graph.output]
    assert names == (
        ["inputs", "puzzle_identifiers"],
        ["logits", "q_halt_logits", "q_continue_logits", "step_predictions"],
    )
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT32
    assert not {n.op_type for n in model.graph.node} & {"Loop", "If", "Scan"}
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 17
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["hrm_deploy.steps"] == "4" and json.loads(meta["hrm_deploy.config"])["hidden_size"] == 64
    # Weights are stored once, not once per step.
    qkv = [i for i in model.graph.initializer if list(i.dims) == [64, 192]]
    assert len(qkv) == 4
    assert result.parity and all(b["logits"]["argmax_agreement"] == 1.0 for b in result.parity["batches"].values())
    manifest = read_manifest(out)
    assert manifest["stage"] == "export" and manifest["unroll"]["steps"] == 4
    assert manifest["io"]["outputs"]["logits"][0] == "FLOAT"
    # steps 0, 1 and the last compared numerically; step 2 proven a copy of step 0
    assert manifest["parity"]["checked_steps"] == [0, 1, 3] and manifest["parity"]["segment"] is None
    assert all(v["logits"]["max_abs"] <= v["logits"]["strict_limit"] for v in result.parity["batches"].values())


@pytest.mark.slow
def test_onnx_matches_pytorch_at_any_batch(tiny_unrolled):
    tiny_model, out, _ = tiny_unrolled
    session = ort_session(str(out))
    for batch in (1, 5):
        feeds = sample_inputs(tiny_model.config, batch, seed=11)
        got = session.run(None, feeds)
        with torch.inference_mode():
            ref = unroll(tiny_model)(torch.from_numpy(feeds["inputs"]), torch.from_numpy(feeds["puzzle_identifiers"]))
        np.testing.assert_allclose(got[0], ref[0].numpy(), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(got[1], ref[1].numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_step_export_loop_matches_unroll(tmp_path, tiny_model):
    out = tmp_path / "tiny.step.onnx"
    export_onnx(tiny_model, out, ExportConfig(mode="step"), quiet=True)
    names = [i.name for i in onnx.load(out).graph.input]
    assert names == ["inputs", "puzzle_identifiers", "z_H", "z_L", "reset"]
    feeds = sample_inputs(tiny_model.config, 2, seed=5)
    got = run_stepwise(ort_session(str(out)), feeds, tiny_model.config, 4)
    with torch.inference_mode():
        ref = unroll(tiny_model)(torch.from_numpy(feeds["inputs"]), torch.from_numpy(feeds["puzzle_identifiers"]))
    np.testing.assert_allclose(got["logits"], ref[0].numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(got["q_halt_logits"], ref[1].numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_external_data_export(tmp_path, tiny_model):
    out = tmp_path / "ext.onnx"
    export_onnx(tiny_model, out, ExportConfig(external_data=True, parity_batches=(2,)), quiet=True)
    assert (tmp_path / "ext.onnx.data").is_file()
    manifest = read_manifest(out)
    assert manifest["external_data"] is True
    # per-step tensors cannot be read from a graph with external weights: end to end plus one tight segment
    assert manifest["parity"]["method"] == "end to end" and manifest["parity"]["segment"]["z_H"]["max_abs"] < 1e-4
    assert ort_session(str(out)).run(None, sample_inputs(tiny_model.config, 1, 0))[0].shape == (1, 81, 11)


@pytest.mark.slow
def test_large_puzzle_table_is_traced_small_and_restored(tmp_path, tiny_config, monkeypatch):
    from hrm_deploy.export import trace
    from hrm_deploy.model.hrm import build_model

    monkeypatch.setattr(trace, "TRACE_TABLE_BYTES", 1000)  # force the swap on a small table
    model = build_model(tiny_config.replace(num_puzzle_identifiers=50), seed=0).eval()
    with torch.no_grad():
        model.inner.puzzle_emb.weights.normal_()
    out = tmp_path / "arcish.onnx"
    export_onnx(model, out, ExportConfig(parity_batches=(1, 4)), quiet=True)
    tables = [i for i in onnx.load(out).graph.initializer if i.name.endswith("puzzle_emb.weights")]
    assert len(tables) == 1 and list(tables[0].dims) == [50, 64]
    assert model.inner.puzzle_emb.weights.shape == (50, 64)


@pytest.mark.slow
def test_parity_failure_is_an_error_with_numbers_and_writes_nothing(tmp_path, tiny_model, monkeypatch):
    def broken_session(path, **options):
        class Wrong:
            def run(self, names, feeds):
                out = ort_session(path, **options).run(names, feeds)
                out[0] = out[0] + 0.5  # a wrong graph
                return out

        return Wrong()

    monkeypatch.setattr(parity_mod, "ort_session", broken_session)
    out = tmp_path / "bad.onnx"
    with pytest.raises(ParityError, match=r"max abs"):
        export_onnx(tiny_model, out, ExportConfig(), quiet=True)
    assert not out.exists() and not list(tmp_path.glob("*.manifest.json"))


@pytest.fixture(scope="module")
def chaotic16(tmp_path_factory):
    """A random tiny model over 16 steps, exported with parity on batches 1 and 3 and no float64
    twin available (the teacher-forced check never needs one)."""
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.model.hrm import build_model
    from tests.conftest import TINY

    model = build_model(HRMConfig(**{**TINY, "halt_max_steps": 16}), seed=3).eval()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parity_mod, "float64_twin", None)
        out = tmp_path_factory.mktemp("chaos") / "chaos.onnx"
        return export_onnx(model, out, ExportConfig(parity_batches=(1, 3)), quiet=True)


@pytest.mark.slow
def test_chaotic_model_passes_teacher_forced_parity(chaotic16):
    """A random model over many steps: ORT and PyTorch float32 disagree legitimately end to end;
    every step checked from the graph's own carry stays within the strict limit, with no
    float64 reference."""
    for entry in chaotic16.parity["batches"].values():
        assert set(entry) == {"z_H", "z_L", "q_halt_logits", "q_continue_logits", "logits"}
        assert all(e["passed"] and e["max_abs"] <= e["strict_limit"] for e in entry.values())
        assert entry["logits"]["check"] == "teacher-forced per step" and entry["logits"]["worst_step"] == 15


@pytest.mark.slow
def test_wrong_carry_in_a_middle_step_fails_parity(tmp_path, tiny_config, monkeypatch):
    """A miswired unroll (step 5 fed step 3's carry) is caught by the per-step check."""
    from hrm_deploy.export import onnx_export
    from hrm_deploy.model.hrm import build_model

    real = onnx_export.assemble

    def miswired(*args, **kwargs):
        model, io_spec = real(*args, **kwargs)
        for node in model.graph.node:
            if node.name.startswith("step5/"):
                node.input[:] = [i.replace("step4/z_H_out", "step3/z_H_out") for i in node.input]
        return model, io_spec

    monkeypatch.setattr(onnx_export, "assemble", miswired)
    model = build_model(tiny_config.replace(halt_max_steps=8), seed=3).eval()
    with pytest.raises(ParityError, match=r"ACT step 5"):
        export_onnx(model, tmp_path / "bad.onnx", ExportConfig(parity_batches=(2,)), quiet=True)


@pytest.mark.slow
def test_sampled_parity_checks_first_two_and_last_step_and_proves_the_copies(chaotic16):
    assert chaotic16.parity["checked_steps"] == [0, 1, 15] and chaotic16.parity["method"] == "teacher-forced per step"
    worst = {e["worst_step"] for entry in chaotic16.parity["batches"].values() for e in entry.values()}
    assert worst <= {0, 1, 15}


@pytest.mark.parametrize(
    ("step", "rewire", "match"),
    [
        (7, ("step6/z_L_out", "step5/z_L_out"), r"ACT step 7 of the unrolled graph is not a copy"),  # structure
        (11, ("step10/z_H_out", "step9/z_H_out"), r"ACT step 11 of the unrolled graph is not a copy"),  # before the cut
        (15, ("step14/z_H_out", "step13/z_H_out"), r"z_\w+ at ACT step 15|logits at ACT step 15"),  # numeric, sampled
    ],
)
@pytest.mark.slow
def test_miswired_copies_fail_parity_wherever_they_are(tmp_path, tiny_config, monkeypatch, step, rewire, match):
    from hrm_deploy.export import onnx_export
    from hrm_deploy.model.hrm import build_model

    real = onnx_export.assemble

    def miswired(*args, **kwargs):
        graph, io_spec = real(*args, **kwargs)
        for node in graph.graph.node:
            if node.name.startswith(f"step{step}/"):
                node.input[:] = [rewire[1] if i == rewire[0] else i for i in node.input]
        return graph, io_spec

    monkeypatch.setattr(onnx_export, "assemble", miswired)
    model = build_model(tiny_config.replace(halt_max_steps=16), seed=3).eval()
    with pytest.raises(ParityError, match=match):
        export_onnx(model, tmp_path / "bad.onnx", ExportConfig(parity_batches=(2,)), quiet=True)
    assert not (tmp_path / "bad.onnx").exists()


@pytest.mark.slow
def test_step_graph_parity_checks_two_calls_from_a_reset(tmp_path, tiny_config):
    from hrm_deploy.model.hrm import build_model

    model = build_model(tiny_config.replace(halt_max_steps=16), seed=3).eval()
    result = export_onnx(model, tmp_path / "s.onnx", ExportConfig(mode="step", parity_batches=(2,)), quiet=True)
    assert result.parity["checked_steps"] == [0, 1]
    assert all(e["passed"] for e in result.parity["batches"]["2"].values())


@pytest.mark.slow
def test_folding_shrinks_the_segment_and_keeps_outputs(tmp_path, tiny_model):
    folded = export_onnx(tiny_model, tmp_path / "f.onnx", ExportConfig(parity=False), quiet=True)
    plain = export_onnx(tiny_model, tmp_path / "p.onnx", ExportConfig(parity=False, fold=False), quiet=True)
    seg = folded.folding["segment"]
    assert seg["folder"] and seg["nodes_after"] < 0.5 * seg["nodes_before"]
    assert folded.nodes < 0.5 * plain.nodes
    ops = [n.op_type for n in onnx.load(tmp_path / "f.onnx").graph.node]
    assert ops.count("Shape") <= 1  # only the embedding's expand to the batch remains
    feeds = sample_inputs(tiny_model.config, 3, seed=2)
    for a, b in zip(
        ort_session(str(tmp_path / "f.onnx")).run(None, feeds), ort_session(str(tmp_path / "p.onnx")).run(None, feeds)
    ):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    assert read_manifest(tmp_path / "f.onnx")["folding"]["segment"]["nodes_after"] == seg["nodes_after"]


@pytest.mark.slow
def test_export_from_upstream_checkpoint_default_name(upstream_run, tmp_path):
    result = export_onnx(upstream_run, None, ExportConfig(parity_batches=(1, 2)), quiet=True)
    assert result.path.parent.name == "export"
    assert result.path.name == "HierarchicalReasoningModel_ACTV1-brave-otter-step_100.onnx"
    assert read_manifest(result.path)["parent"]["sha256"]


def test_bad_export_options():
    with pytest.raises(ConfigError, match="opset"):
        ExportConfig(opset=13)
    with pytest.raises(ConfigError, match="mode"):
        ExportConfig(mode="scan")
