"""A TRM checkpoint in upstream's layout through the runners and engines: ONNX Runtime, the
cpu target, the PyTorch engine, a TensorRT-RTX build, verify, solve and the halting rule."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tests.conftest import make_trm, write_trm_upstream_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trm_deploy(tmp_path_factory):
    """An mlp_t and an attention TRM run, Sudoku data of their size, and their step exports."""
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.export.onnx_export import export_onnx

    root = tmp_path_factory.mktemp("trm_deploy")
    data = root / "sudoku"
    generate_sudoku(SudokuSpec(train=24, test=24, blanks=(10, 20), seed=5, workers=1), str(data))
    runs = {}
    for variant in ("mlp_t", "attention"):
        ckpt = write_trm_upstream_run(root / variant, make_trm(variant), data_rel=str(data))
        runs[variant] = SimpleNamespace(
            checkpoint=ckpt, step=export_onnx(ckpt, root / f"{variant}.onnx", quiet=True).path
        )
    return SimpleNamespace(data=data, **runs)


@pytest.mark.parametrize("variant", ["mlp_t", "attention"])
def test_cpu_target_builds_and_verifies(trm_deploy, tmp_path, variant):
    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.verify import verify

    run = getattr(trm_deploy, variant)
    engine = build_engine(run.step, EngineConfig("fp32", target="cpu"), tmp_path / "trm.cpu.onnx", quiet=True)
    for artifact in (run.step, engine.path):
        report = verify(artifact, trm_deploy.data, samples=24, quiet=True)
        assert report["passed"], report["failures"]
        assert report["logits"]["argmax_agreement"] == 1.0


def test_cpu_target_static_int8_of_the_trained_trm_builds_and_verify_names_its_confident_flips(tmp_path):
    """The cpu target's static INT8 reads a TRM graph's config as TRM's (it once read every graph's
    as HRM's and refused TRM after calibrating). The bundled trained TRM (a random one is too
    chaotic to quantize), calibrated and held out on its own dataset by default: the graph is
    measured on the whole test split and keeps FP32's answers on >= 99.9 % of the cells, within the
    build's budget; but a few of its flips are cells FP32 was sure of (a top-1 minus top-2 margin of
    about the logits' whole scale), answered as surely wrong, and verify fails them: the only
    failures it may have. The build's accuracy rule does not judge flips yet (it would keep the
    harmful layers in float); until it does, this is the defect verify reports (docs/guarantees.md)."""
    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.manifest import read_manifest
    from hrm_deploy.precision.registry import PRECISIONS
    from hrm_deploy.provenance import default_data
    from hrm_deploy.train.presets import bundled_checkpoint
    from hrm_deploy.verify import verify

    fp32 = export_onnx(bundled_checkpoint("trm-sudoku-small"), tmp_path / "trm.onnx", ExportConfig(parity=False))
    config = EngineConfig("int8", target="cpu", calib_samples=64)
    engine = build_engine(fp32.path, config, tmp_path / "trm.int8.cpu.ort.onnx", quiet=True)
    accuracy = read_manifest(engine.path)["recipe"]["accuracy"]
    assert accuracy["checked"] and accuracy["measured"]["holdout_puzzles"] >= 64  # not the 1-puzzle test split
    data = default_data(fp32.path, "--data", {"test": None}).path
    report = verify(engine.path, data, samples=128, quiet=True)
    assert report["logits"]["argmax_agreement"] >= 0.999
    assert report["exact_drop_points"] <= PRECISIONS["int8"].thresholds.max_exact_drop_points
    assert report["logits"]["max_rel_agreeing"] <= PRECISIONS["int8"].thresholds.max_logits_rel_error
    # measured on an AVX-512 VNNI CPU: 6 flips, 4 of them where FP32's margin was 0.9 to 1.2 of the scale
    # (their logits 1.2 of the scale away, past the band too); another CPU's integer kernels may flip others
    known = ("answers flipped where the reference was sure", "a cell's logits are")
    assert all(failure.startswith(known) for failure in report["failures"]), report["failures"]


def test_torch_engine_builds_from_the_checkpoint_in_step_mode(trm_deploy, tmp_path):
    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.manifest import read_manifest
    from hrm_deploy.verify import verify

    result = build_engine(
        trm_deploy.mlp_t.checkpoint, EngineConfig("fp32", backend="torch", max_batch=8), tmp_path / "t.pt2", quiet=True
    )
    assert read_manifest(result.path)["mode"] == "step"
    report = verify(result.path, trm_deploy.data, samples=16, quiet=True)
    assert report["passed"], report["failures"]


def test_tensorrt_rtx_builds_the_step_graph(trm_deploy, tmp_path, monkeypatch):
    from hrm_deploy.backends.tensorrt.api import load_backend
    from hrm_deploy.engines.build import EngineConfig, build_engine
    from hrm_deploy.errors import DependencyError
    from hrm_deploy.manifest import read_manifest

    try:
        load_backend("tensorrt-rtx")
    except DependencyError:
        pytest.skip("tensorrt-rtx is not installed (pip install 'hrm-deploy[rtx]')")
    monkeypatch.chdir(tmp_path)
    result = build_engine(trm_deploy.mlp_t.step, EngineConfig("fp16", max_batch=8), tmp_path / "t.engine", quiet=True)
    manifest = read_manifest(result.path)
    assert manifest["backend"]["name"] == "tensorrt-rtx" and manifest["mode"] == "step"
    assert result.path.stat().st_size > 100_000


def test_q_rule_follows_the_checkpoint(trm_deploy, upstream_run):
    from hrm_deploy.halting import HaltRule, resolve_rule

    for artifact in (trm_deploy.mlp_t.step, trm_deploy.mlp_t.checkpoint):
        assert resolve_rule("q", str(artifact)).q_halt_only  # trained with no_ACT_continue
    assert not resolve_rule("q", str(upstream_run)).q_halt_only  # HRM: q_halt > q_continue
    q_halt, q_continue = np.array([0.5, -0.5, 0.5]), np.array([2.0, -2.0, -2.0])
    assert HaltRule.parse("q").should_halt(1, q_halt, q_continue).tolist() == [False, True, True]
    trm_rule = resolve_rule("q", str(trm_deploy.attention.step))
    assert trm_rule.should_halt(1, q_halt, q_continue).tolist() == [True, False, True]
    # serve --halt q halts a TRM model on q_halt > 0 too, an HRM model on q_halt > q_continue
    from hrm_deploy.serve.server import halt_function

    assert halt_function("q", trm_deploy.attention.step)(1, q_halt, q_continue).tolist() == [True, False, True]
    assert halt_function("q", upstream_run)(1, q_halt, q_continue).tolist() == [False, True, True]


def test_solve_and_torch_reference_halting(trm_deploy):
    from hrm_deploy.backends import open_runner
    from hrm_deploy.data.examples import load_examples
    from hrm_deploy.halting import resolve_rule
    from hrm_deploy.solve import solve

    examples = load_examples(str(trm_deploy.data), 4, "test")
    text = "\n".join("".join(str(max(int(t) - 1, 0)) for t in row) for row in examples.inputs)
    for artifact in (trm_deploy.mlp_t.step, trm_deploy.mlp_t.checkpoint):
        solutions = solve(text, artifact, halt="q", quiet=True)
        assert len(solutions) == 4 and all(1 <= s.steps_used <= 3 for s in solutions)
    rule = resolve_rule("q", str(trm_deploy.mlp_t.checkpoint))
    feeds = {"inputs": examples.inputs, "puzzle_identifiers": examples.puzzle_identifiers}
    with open_runner(Path(trm_deploy.mlp_t.checkpoint)) as runner:
        out = runner.infer(feeds, halt=rule.should_halt)
        full = runner.infer(feeds)
    first_halt = np.argmax(np.concatenate([full["q_halt_logits"] > 0, np.ones((4, 1), bool)], 1), 1) + 1
    assert out["steps_used"].tolist() == np.minimum(first_halt, 3).tolist()


def test_verify_defaults_to_the_data_paths_dataset(trm_deploy):
    """An upstream TRM run names its datasets under data_paths (a list): verify finds them."""
    from hrm_deploy.provenance import default_data

    assert Path(default_data(trm_deploy.mlp_t.step, "--data").path).resolve() == trm_deploy.data.resolve()


def test_q_rule_read_from_the_graph_without_manifest(trm_deploy, tmp_path):
    import shutil

    from hrm_deploy.halting import resolve_rule

    bare = tmp_path / "bare.onnx"
    shutil.copy(trm_deploy.mlp_t.step, bare)  # no manifest beside it: the graph's recorded config tells
    assert resolve_rule("q", str(bare)).q_halt_only


def test_triton_act_driver_uses_the_trm_q_rule(trm_deploy, tmp_path):
    """triton-repo --halt q of a TRM step graph writes the driver's q_halt > 0 rule (q0)."""
    import importlib.util
    import sys
    import types

    from hrm_deploy.serve.repo import RepoConfig, write_triton_repo

    write_triton_repo([trm_deploy.mlp_t.step], RepoConfig(output=tmp_path / "repo", halt="q", names=("trm",)))
    config = (tmp_path / "repo" / "trm" / "config.pbtxt").read_text()
    assert 'key: "halt"' in config and 'string_value: "q0"' in config
    spec = importlib.util.spec_from_file_location("act_driver", tmp_path / "repo" / "trm" / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    spec.loader.exec_module(module)
    rule = module.halting("q0")
    assert rule(np.array([0.5, -0.5]), np.array([2.0, -2.0])).tolist() == [True, False]


@pytest.mark.slow
def test_bench_measures_a_trm_step_graph_beside_its_reference(trm_deploy, tmp_path):
    from hrm_deploy.bench.run import BenchConfig, bench

    report = bench(
        [trm_deploy.mlp_t.step],
        BenchConfig(
            data=str(trm_deploy.data),
            batches=(1, 4),
            iters=2,
            warmup=1,
            accuracy_samples=16,
            out_dir=str(tmp_path / "bench"),
        ),
    )
    rows = {r["runner"]: r for r in report["rows"]}
    assert rows["ort"]["status"] == "ok", rows["ort"]
    assert rows["ort"]["accuracy"] == rows["reference"]["accuracy"]  # the same answers as the TRM reference


@pytest.mark.slow
def test_serve_answers_a_trm_step_graph_like_the_runner(trm_deploy, tmp_path):
    from hrm_deploy.backends import open_runner
    from hrm_deploy.serve.client import infer_remote
    from tests.serve.helpers import ServeProcess, puzzles, serving_unavailable

    why = serving_unavailable()
    if why is not None:
        pytest.skip(why)
    tokens, ids = puzzles(str(trm_deploy.data), 6)
    with open_runner(trm_deploy.mlp_t.step) as runner:
        want = runner.infer({"inputs": tokens, "puzzle_identifiers": ids})
    proc = ServeProcess(trm_deploy.mlp_t.step, tmp_path / "serve.log", "--max-batch", "8")
    try:
        proc.wait_ready()
        got = infer_remote(proc.url, {"inputs": tokens, "puzzle_identifiers": ids}, timeout_s=60)
    finally:
        proc.stop()
    np.testing.assert_array_equal(got["answer"], want["logits"].argmax(-1))
