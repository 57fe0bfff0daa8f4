"""TRM export: step (the family's default) and unrolled ONNX graphs equal upstream's forward code
(tests/model/trm_oracle.py) at several batch sizes, for both variants; inspect names the family."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
from hrm_deploy.inspection import inspect_artifact
from hrm_deploy.manifest import read_manifest
from hrm_deploy.onnx_runtime import ort_session, run_stepwise
from tests.conftest import TRM_TINY
from tests.model.test_trm import _oracle_for
from tests.model.trm_oracle import upstream_eval

pytestmark = pytest.mark.slow


def _feeds(batch: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "inputs": rng.integers(0, TRM_TINY["vocab_size"], (batch, TRM_TINY["seq_len"]), dtype=np.int32),
        "puzzle_identifiers": rng.integers(0, TRM_TINY["num_puzzle_identifiers"], (batch,), dtype=np.int32),
    }


def _assert_matches_upstream(got: dict[str, np.ndarray], step_path, feeds) -> None:
    """Argmax agreement 100 % with upstream's code in float32, and every output within the
    export parity's tolerance: 10x the float32-vs-float64 noise of upstream's code plus 1e-4 of scale."""
    args = [torch.from_numpy(feeds[k]) for k in ("inputs", "puzzle_identifiers")]
    steps = TRM_TINY["halt_max_steps"]
    ref32 = [t.numpy() for t in upstream_eval(_oracle_for(step_path), *args, steps)]
    ref64 = [t.numpy() for t in upstream_eval(_oracle_for(step_path, "float64"), *args, steps)]
    assert (got["logits"].argmax(-1) == ref32[0].argmax(-1)).all()
    for name, r32, r64 in zip(("logits", "q_halt_logits", "q_continue_logits"), ref32, ref64):
        noise = np.abs(r32 - r64).max()
        limit = 10 * noise + 1e-4 * max(1.0, np.abs(r64).max())
        assert np.abs(got[name] - r64).max() <= limit, (name, np.abs(got[name] - r64).max(), limit)


def test_step_export_is_default_and_equals_upstream(trm_run, tmp_path):
    step_path, model = trm_run
    result = export_onnx(step_path, tmp_path / "trm.onnx", quiet=True)
    manifest = read_manifest(result.path)
    assert manifest["mode"] == "step" and manifest["config"]["export"]["mode"] == "step"
    assert manifest["unroll"]["family"] == "trm" and manifest["unroll"]["blocks_per_step"] == 16
    assert result.parity is not None and all(
        b["logits"]["argmax_agreement"] == 1.0 for b in result.parity["batches"].values()
    )
    session = ort_session(str(result.path))
    for batch in (1, 4):  # dynamic batch
        feeds = _feeds(batch, batch)
        got = run_stepwise(session, feeds, None, TRM_TINY["halt_max_steps"])
        _assert_matches_upstream(got, step_path, feeds)
    info = inspect_artifact(result.path)["model"]
    assert info["family"] == "trm" and info["mixer"] == ("mlp-t" if model.config.mlp_t else "attention")


def test_unrolled_export_equals_upstream(trm_run, tmp_path):
    step_path, _ = trm_run
    result = export_onnx(step_path, tmp_path / "trm.onnx", ExportConfig(mode="unrolled"), quiet=True)
    session = ort_session(str(result.path))
    for batch in (1, 3):
        feeds = _feeds(batch, 10 + batch)
        got = dict(zip(("logits", "q_halt_logits", "q_continue_logits"), session.run(None, feeds)))
        _assert_matches_upstream(got, step_path, feeds)


def test_padded_puzzle_prefix_survives_shape_folding(tmp_path):
    """An HRM whose puzzle embedding is narrower than its prefix (zero padding in the embedding)
    exports with folding on: the padding is traced as a concatenation, which folds correctly."""
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.model.hrm import build_model
    from tests.conftest import TINY

    model = build_model(HRMConfig(**{**TINY, "puzzle_emb_ndim": 40, "num_puzzle_identifiers": 3}), seed=0).eval()
    with torch.no_grad():
        model.inner.puzzle_emb.weights.normal_(0, 1.0)
    result = export_onnx(model, tmp_path / "hrm.onnx", ExportConfig(steps=2), quiet=True)
    assert result.parity is not None and result.folding["embed"]["folder"]
