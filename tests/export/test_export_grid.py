"""Every valid recursion exports: folding never multiplies constants with the cycle count.

A folder evaluates each traced use of a shared tensor on its own; the RoPE tables are used once
per attention call, so a segment with H_cycles x (L_cycles + 1) x layers calls used to carry that
many copies of them and upstream's TRM recipes (H/L 3/4, 3/6) failed to export. The grid exports
HRM and both TRM variants over cycles and layers in step and unrolled modes, each with the
export's own parity check against PyTorch.
"""

from __future__ import annotations

import onnx
import pytest
import torch

from hrm_deploy.export.graph import fold_constants, initializer_bytes
from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
from hrm_deploy.model.checkpoint import save_checkpoint
from hrm_deploy.model.config import HRMConfig
from hrm_deploy.model.hrm import build_model
from hrm_deploy.model.trm_config import TRMConfig
from tests.conftest import TRM_TINY, TRM_VARIANTS

# small enough that one export with parity takes about a second
GRID_BASE = dict(seq_len=16, vocab_size=11, num_puzzle_identifiers=1, hidden_size=32, num_heads=2, halt_max_steps=2)


class _SharedTable(torch.nn.Module):
    """One buffer read through ``unsqueeze`` by many calls, as the RoPE tables are."""

    def __init__(self, uses: int) -> None:
        super().__init__()
        self.uses = uses
        self.register_buffer("table", torch.randn(2048, 64))  # 512 KiB
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, 2048, 1, 64]
        for _ in range(self.uses):
            x = self.proj(x * self.table.unsqueeze(-2))
        return x


def test_folding_shares_constants_derived_per_use(tmp_path):
    """Eight uses of a 512 KiB table must not leave eight folded copies (4 MiB): before the fix this
    raised 'constant folding duplicated weights'."""
    pytest.importorskip("onnxslim")
    path = tmp_path / "shared.onnx"
    torch.onnx.export(
        _SharedTable(8),
        (torch.randn(1, 2048, 1, 64),),
        str(path),
        dynamo=False,
        opset_version=18,
        do_constant_folding=False,  # leaves the per-use Unsqueeze nodes to onnxslim, as traced segments do
    )
    model = onnx.load(str(path))
    folded, _ = fold_constants(model)
    assert initializer_bytes(folded) <= initializer_bytes(model) + 4096
    sess_in = {"x": torch.randn(1, 2048, 1, 64).numpy()}
    import onnxruntime as ort

    def run(m: onnx.ModelProto):
        s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        return s.run(None, {s.get_inputs()[0].name: sess_in["x"]})[0]

    assert (run(folded) == run(model)).all()


def _export(tmp_path, model, mode: str) -> None:
    ckpt = save_checkpoint(tmp_path / "m.pt", model)
    result = export_onnx(ckpt, tmp_path / f"m.{mode}.onnx", ExportConfig(mode=mode, max_batch=4), quiet=True)
    assert result.parity is not None  # export raises ParityError on a mismatch


@pytest.mark.slow
def test_trm_upstream_arc_recipe_exports(tmp_path):
    """TRM's own ARC/Maze setting (H/L 3/4) at a long sequence: 60 RoPE copies of 58 KiB each
    exceeded the folder's growth bound before the fix."""
    cfg = TRMConfig(**{**TRM_TINY, "seq_len": 900, "H_cycles": 3, "L_cycles": 4, "halt_max_steps": 1})
    _export(tmp_path, build_model(cfg, seed=0).eval(), "step")


# The folding bug lived in the traced segment, which step and unrolled graphs share (the unroll
# repeats the folded segment): the step mode covers the whole grid; the unrolled mode the corners
# and upstream's recipes, which keeps the grid at a few minutes of CI.
TRM_GRID = [("step", v, hc, lc) for v in sorted(TRM_VARIANTS) for hc in (1, 2, 3) for lc in range(1, 7)]
TRM_GRID += [
    ("unrolled", v, hc, lc) for v in sorted(TRM_VARIANTS) for hc, lc in ((1, 1), (1, 6), (3, 1), (3, 4), (3, 6))
]
HRM_GRID = [("step", n, hc, lc) for n in (1, 2, 3, 4) for hc in (1, 2, 3) for lc in (1, 2, 3)]
HRM_GRID += [("unrolled", n, hc, lc) for n in (1, 4) for hc, lc in ((1, 1), (3, 3), (1, 3), (3, 1))]


@pytest.mark.slow
@pytest.mark.parametrize("mode,variant,H_cycles,L_cycles", TRM_GRID)
def test_trm_grid_exports(tmp_path, mode, variant, H_cycles, L_cycles):
    cfg = TRMConfig(
        **{
            **GRID_BASE,
            "H_cycles": H_cycles,
            "L_cycles": L_cycles,
            "L_layers": 2,
            "puzzle_emb_len": 4,
            "puzzle_emb_ndim": 32,
        },
        **TRM_VARIANTS[variant],
    )
    _export(tmp_path, build_model(cfg, seed=H_cycles * 10 + L_cycles).eval(), mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode,layers,H_cycles,L_cycles", HRM_GRID)
def test_hrm_grid_exports(tmp_path, mode, layers, H_cycles, L_cycles):
    cfg = HRMConfig(
        **{**GRID_BASE, "H_cycles": H_cycles, "L_cycles": L_cycles, "H_layers": layers, "L_layers": layers},
        puzzle_emb_ndim=32,
        pos_encodings="rope",
    )
    _export(tmp_path, build_model(cfg, seed=layers * 100 + H_cycles * 10 + L_cycles).eval(), mode)
