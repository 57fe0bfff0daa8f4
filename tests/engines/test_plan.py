"""The memory plan (``hrm-deploy plan``, and build-engine's check for targets with a memory budget),
against numbers worked out by hand for the bundled model, the Sudoku-size model and an ARC-size
puzzle table on the 8 GB Orin.

Graphs here hold initializers of the right shapes and no bytes (the plan reads shapes and dtypes only),
so a Sudoku-size or ARC-size plan costs nothing to make."""

from __future__ import annotations

import json

import pytest

from hrm_deploy.engines.plan import MIB, memory_plan, plan_graph
from hrm_deploy.engines.targets import get_target
from hrm_deploy.errors import ConfigError

onnx = pytest.importorskip("onnx", reason="pip install 'hrm-deploy[onnx]'")
from onnx import TensorProto, helper  # noqa: E402

ORIN = get_target("jetson-orin-8gb")
BUDGET = 8192 - 1300  # MiB: the module's 8 GiB less carve-outs and a headless system
RUNTIME = 900 * MIB

# Upstream's Sudoku model: hidden 512, 8 heads, expansion 4 (SwiGLU width round(4*512*2/3)=1365 -> 1536),
# 4 H + 4 L layers, 81 cells + 1 puzzle-prefix position (puzzle_emb_ndim 512) = 82 positions, vocabulary 11
SUDOKU = dict(
    seq_len=81,
    vocab_size=11,
    num_puzzle_identifiers=1,
    hidden_size=512,
    num_heads=8,
    expansion=4.0,
    H_layers=4,
    L_layers=4,
    H_cycles=2,
    L_cycles=2,
    halt_max_steps=16,
    puzzle_emb_ndim=512,
)
# per block 512*1536 + 512*512 + 512*3072 + 1536*512 = 3,407,872; x 8 = 27,262,976; embeddings and heads
# 11*512 * 2 + 512*2 + 2 = 12,290: 27,275,266 parameters
SUDOKU_PARAMS = 27_275_266


def _shape_only(name: str, dtype: int, dims: list[int]) -> TensorProto:
    tensor = TensorProto(name=name, data_type=dtype)
    tensor.dims.extend(dims)
    return tensor


def graph(config: dict, params: int, mode: str = "step", table_rows: int = 0, dtype: int = TensorProto.FLOAT):
    """An ONNX model with one weight initializer of ``params`` elements (no data) and, with
    ``table_rows``, the puzzle table [rows, puzzle_emb_ndim], plus the export's metadata."""
    inits = [_shape_only("w", dtype, [params])]
    if table_rows:
        inits.append(
            _shape_only("embed/puzzle_emb.weights", TensorProto.FLOAT, [table_rows, config["puzzle_emb_ndim"]])
        )
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [], [], initializer=inits)
    model = helper.make_model(g)
    meta = {"mode": mode, "steps": 16, "precision": "fp32", "puzzle_emb": "embedded", "config": {**config}}
    return model, meta


def test_sudoku_size_step_graph_at_fp16_by_hand():
    model, meta = graph(SUDOKU, SUDOKU_PARAMS)
    plan = plan_graph(model, meta, ORIN, "fp16", max_batch=16)
    assert plan.weights == 2 * SUDOKU_PARAMS == 54_550_532  # 52.0 MiB in 16 bits
    assert plan.budget_mib == BUDGET and plan.fixed == RUNTIME + 54_550_532
    # per row: activations 82 x (4*512 + max(4*512 + 8*82, 3*1536)) = 82 x 6,656 elements x 2 bytes = 1,091,584;
    # carry z_H, z_L in and out: 4 x 82 x 512 x 4 bytes = 671,744; I/O: ids 81*8 + 8, logits 81*11*4, q 2*4 = 4,228
    assert [b.batch for b in plan.buckets] == [1, 2, 4, 8, 16]
    last = plan.buckets[-1]
    assert (last.activations, last.carry, last.io) == (16 * 1_091_584, 16 * 671_744, 16 * 4_228)
    # every bucket 1..16 held: 31 rows of carry and I/O, the scratch of 16
    assert last.total == RUNTIME + 54_550_532 + 16 * 1_091_584 + 31 * (671_744 + 4_228)
    assert plan.fits and plan.largest_batch == 16 and not plan.advice()  # about 1,004 MiB of 6,892


def test_int8_weights_count_one_byte_and_fp32_four():
    model, meta = graph(SUDOKU, SUDOKU_PARAMS, dtype=TensorProto.INT8)
    assert plan_graph(model, meta, ORIN, "int8").weights == SUDOKU_PARAMS
    model, meta = graph(SUDOKU, SUDOKU_PARAMS)
    fp32 = plan_graph(model, meta, ORIN, "fp32", max_batch=1)
    assert fp32.weights == 4 * SUDOKU_PARAMS and fp32.buckets[0].activations == 2 * 1_091_584  # 4-byte activations


def test_an_arc_size_table_and_where_it_stops_fitting():
    # upstream's ARC vocabulary at hidden 512: ~1.05 M puzzle ids x 512 x 4 bytes; here 2**20 rows = 2 GiB exactly
    arc = {**SUDOKU, "seq_len": 900, "vocab_size": 12, "num_puzzle_identifiers": 1 << 20}
    model, meta = graph(arc, SUDOKU_PARAMS + 12 * 512 * 2 - 11 * 512 * 2, table_rows=1 << 20)
    plan = plan_graph(model, meta, ORIN, "fp32", max_batch=128)
    assert plan.puzzle_table == 2 * 1024 * MIB and plan.table_resident
    # per row at fp32: 901 x (2048 + max(2048 + 8*901, 4608)) x 4 = 901 x 11,304 x 4 = 40,739,616 bytes of activations;
    # carry 4 x 901 x 512 x 4 = 7,380,992; I/O 900*8 + 8 + 900*12*4 + 2*4 = 50,416
    row_carry_io = 7_380_992 + 50_416
    fixed = RUNTIME + 4 * (SUDOKU_PARAMS + 512 * 2) + 2 * 1024 * MIB  # 3,200,307,208 bytes: 3,052 MiB
    by_batch = {b.batch: b for b in plan.buckets}
    assert by_batch[16].total == fixed + 16 * 40_739_616 + 31 * row_carry_io == 4_082_514_712  # 3,893 MiB
    assert by_batch[64].total == fixed + 64 * 40_739_616 + 127 * row_carry_io == 6_751_431_448  # 6,439 MiB: fits
    assert by_batch[128].total == fixed + 128 * 40_739_616 + 255 * row_carry_io == 10_309_987_096  # 9,832 MiB: no
    assert by_batch[64].fits and not by_batch[128].fits and plan.largest_batch == 64
    line = plan.refusal()
    assert "--max-batch 64" in line and "--puzzle-emb external" in line and "--fp16" in line
    model, meta = graph(arc, SUDOKU_PARAMS + 12 * 512 * 2 - 11 * 512 * 2)  # an external-table export: no table inside
    external = plan_graph(model, meta, ORIN, "fp32", max_batch=128, puzzle_emb="external")
    assert external.puzzle_table == 2 * 1024 * MIB and not external.table_resident
    assert (
        external.fixed == fixed - 2 * 1024 * MIB and external.largest_batch == 64
    )  # the 2 GiB table memory-mapped, not resident


def test_targets_without_a_budget_are_refused():
    model, meta = graph(SUDOKU, 10)
    with pytest.raises(ConfigError, match="no memory budget"):
        plan_graph(model, meta, get_target("desktop"), "fp16")


def test_plan_command_on_the_bundled_step_graph(tiny_onnx):
    from typer.testing import CliRunner

    from hrm_deploy.cli import app

    done = CliRunner().invoke(app, ["plan", str(tiny_onnx.step), "--json"])
    assert done.exit_code == 0, done.output
    plan = json.loads(done.output)
    assert plan["precision"] == "fp16" and plan["fits"] and plan["largest_batch"] == ORIN.max_batch
    bad = CliRunner().invoke(app, ["plan", str(tiny_onnx.step), "--target", "cpu"])
    assert bad.exit_code == 2 and "no memory budget" in bad.output


def test_plan_of_an_engine_reads_its_file_and_profile(tiny_onnx, tmp_path):
    from hrm_deploy.manifest import write_manifest

    engine = tmp_path / "tiny.step.fp16.engine"
    engine.write_bytes(b"\0" * 3 * MIB)
    write_manifest(
        engine,
        stage="engine",
        config={},
        parent=tiny_onnx.step,
        precision="fp16",
        profile_shapes={"inputs": [[1, 81], [1, 81], [4, 81]]},
    )
    plan = memory_plan(engine)
    assert plan.weights == 3 * MIB and plan.weights_from == "engine file" and plan.buckets[-1].batch == 4


def test_the_bundled_default_step_graph_by_hand(bundled_export):
    """sudoku-small: hidden 64, 4 heads, SwiGLU width round(4*64*2/3)=171 -> 256, 1 H + 1 L layer, 81 cells + 1 prefix
    position. Parameters: per block 64*192 + 64*64 + 64*512 + 256*64 = 65,536, x 2 = 131,072; embeddings and heads
    11*64 * 2 + 64*2 + 2 = 1,538: 132,610."""

    plan = memory_plan(bundled_export(mode="step"), max_batch=16)
    assert plan.precision == "fp16" and plan.mode == "step"
    # the weights at 16 bits, plus the constants the export folds in (RoPE tables, the initial carry)
    assert 2 * 132_610 <= plan.weights <= 2 * 132_610 + 2 * 3 * 82 * 64 + 64 * 1024
    # per row: activations 82 x (4*64 + max(4*64 + 4*82, 3*256)) = 82 x 1,024 x 2 bytes = 167,936; carry 4 x 82 x 64 x 4
    # = 83,968; I/O 81*8 + 8 + 81*11*4 + 8 = 4,228
    last = plan.buckets[-1]
    assert (last.activations, last.carry, last.io) == (16 * 167_936, 16 * 83_968, 16 * 4_228)
    assert last.total == plan.fixed + 16 * 167_936 + 31 * (83_968 + 4_228) and plan.largest_batch == 16
