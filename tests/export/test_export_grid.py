"""Every valid recursion exports: folding never multiplies constants with the cycle count.

A folder evaluates each traced use of a shared tensor on its own; the RoPE tables are used once
per attention call, so a segment with H_cycles x (L_cycles + 1) x layers calls used to carry that
many copies of them and upstream's TRM recipes (H/L 3/4, 3/6) failed to export. The grid
(``benchmarks/export_grid.py``, which sweeps all of it and records the verdicts) spans HRM and both
TRM variants over cycles and layers in step and unrolled modes; here a pairwise subset of it is
exported, each with the export's own parity check against PyTorch: every value of every axis and
every pair of values the grid holds, and the deepest TRM and HRM cases.
"""

from __future__ import annotations

import onnx
import pytest
import torch

from hrm_deploy.export.graph import fold_constants, initializer_bytes
from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
from hrm_deploy.model.checkpoint import save_checkpoint
from hrm_deploy.model.hrm import build_model
from hrm_deploy.model.trm_config import TRMConfig
from tests.conftest import TRM_TINY
from tests.device_check_helpers import load_benchmark

GRID = load_benchmark("export_grid")


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


def _pairs(case: tuple) -> set[tuple]:
    return {(i, case[i], j, case[j]) for i in range(len(case)) for j in range(i + 1, len(case))}


def pairwise(cases: list[tuple], seeds: list[tuple]) -> list[tuple]:
    """A subset of ``cases`` (tuples of (mode, variant or layers, H_cycles, L_cycles)) holding every
    pair of axis values that ``cases`` holds: ``seeds`` first, then greedily the case covering the
    most missing pairs, the cheaper on a tie (step before unrolled, fewer cycles)."""
    chosen = list(seeds)
    missing = set().union(*map(_pairs, cases)) - set().union(*map(_pairs, chosen))
    while missing:
        best = max(cases, key=lambda c: (len(_pairs(c) & missing), c[0] == "step", -c[2] * c[3]))
        chosen.append(best)
        missing -= _pairs(best)
    return chosen


# the deepest cases, where the folded copies multiplied most: upstream's deepest TRM recipe (H/L 3/6)
# with attention (RoPE tables at every call) and the HRM of the most layers at the most cycles
DEEPEST_TRM, DEEPEST_HRM = ("step", "attention", 3, 6), ("step", 4, 3, 3)
TRM_CASES = pairwise(GRID.TRM_GRID, [DEEPEST_TRM])
HRM_CASES = pairwise(GRID.HRM_GRID, [DEEPEST_HRM])


def test_the_subset_holds_every_value_and_pair_of_the_grid():
    for grid, subset in ((GRID.TRM_GRID, TRM_CASES), (GRID.HRM_GRID, HRM_CASES)):
        assert set().union(*map(_pairs, subset)) == set().union(*map(_pairs, grid))
        assert len(set(subset)) == len(subset) < len(grid) / 2
    assert DEEPEST_TRM in GRID.TRM_GRID and DEEPEST_HRM in GRID.HRM_GRID


@pytest.mark.slow
@pytest.mark.parametrize("mode,mixer,H_cycles,L_cycles", TRM_CASES)
def test_trm_grid_exports(tmp_path, mode, mixer, H_cycles, L_cycles):
    _export(tmp_path, GRID.trm_model(mixer, H_cycles, L_cycles), mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode,layers,H_cycles,L_cycles", HRM_CASES)
def test_hrm_grid_exports(tmp_path, mode, layers, H_cycles, L_cycles):
    _export(tmp_path, GRID.hrm_model(layers, H_cycles, L_cycles), mode)
