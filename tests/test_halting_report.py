"""verify --halt: per-rule accuracy and steps, the curve (JSON + PNG), budget stored in the manifest."""

import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    """A few labelled Sudoku (the random model's accuracy is 0 anyway: these tests check the plumbing)."""
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    folder = tmp_path_factory.mktemp("small") / "data"
    generate_sudoku(SudokuSpec(train=32, test=32, blanks=(3, 6), seed=5), str(folder))
    return str(folder)


@pytest.mark.slow
def test_verify_reports_halting_rules_on_a_step_graph(tiny_model, small_data, tmp_path):
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.manifest import read_manifest
    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.verify import markdown, verify

    ckpt = save_checkpoint(tmp_path / "rand.pt", tiny_model)
    step = export_onnx(ckpt, tmp_path / "rand.step.onnx", ExportConfig(mode="step", parity=False), quiet=True).path
    report = verify(step, small_data, samples=32, halt=["q", "threshold:0.5", "budget:1"], max_steps=3)
    halting = report["halting"]
    assert halting["steps"] == 4 and set(halting["rules"]) == {"q", "threshold:0.5", "budget:1"}
    for entry in halting["rules"].values():
        assert entry["run"] == "early exit" and entry["agrees_with_simulation"] == 1.0
        assert 1 <= entry["mean_steps"] <= 3 and entry["p90_steps"] <= 3  # max_steps bounds every rule
    assert halting["curve"] and all({"threshold", "mean_steps", "exact_accuracy"} <= set(c) for c in halting["curve"])
    saved = json.loads((tmp_path / "rand.step.onnx.halting.json").read_text())
    assert saved["rules"]["q"]["mean_steps"] == halting["rules"]["q"]["mean_steps"]
    assert (tmp_path / "rand.step.onnx.halting.png").stat().st_size > 0
    budgets = read_manifest(step)["halting"]["budgets"]
    [(key, entry)] = budgets.items()
    assert key.startswith("1|") and entry["split"] == "train" and entry["loss_points"] <= 1.0
    assert halting["rules"]["budget:1"]["threshold"] == entry["threshold"]
    assert "halting rule" in markdown(report)


@pytest.mark.slow
def test_unrolled_graph_halting_is_simulated_from_step_predictions(tiny_model, small_data, tmp_path):
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.verify import verify

    ckpt = save_checkpoint(tmp_path / "rand.pt", tiny_model)
    unrolled = export_onnx(
        ckpt, tmp_path / "rand.onnx", ExportConfig(parity=False, step_predictions=True), quiet=True
    ).path
    report = verify(unrolled, small_data, samples=32, halt=["q"])
    entry = report["halting"]["rules"]["q"]
    assert entry["run"].startswith("simulated") and np.isfinite(entry["mean_steps"])


@pytest.mark.slow
def test_bench_halt_writes_rules_and_curve(tiny_model, small_data, tmp_path):
    from hrm_deploy.bench.run import BenchConfig, bench
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.model.checkpoint import save_checkpoint

    ckpt = save_checkpoint(tmp_path / "rand.pt", tiny_model)
    step = export_onnx(ckpt, tmp_path / "rand.step.onnx", ExportConfig(mode="step", parity=False), quiet=True).path
    config = BenchConfig(
        data=small_data,
        batches=(8,),
        iters=1,
        warmup=0,
        accuracy_samples=16,
        out_dir=str(tmp_path / "bench"),
        halt=("q", "threshold:0.5"),
        include_reference=True,
    )
    report = bench([str(step)], config)
    for row in report["rows"]:
        assert set(row["halting"]["rules"]) == {"q", "threshold:0.5"}, row["artifact"]
        assert all(r["run"] == "early exit" and r["puzzles_per_s"] > 0 for r in row["halting"]["rules"].values())
    saved = json.loads((tmp_path / "bench" / "halting.json").read_text())
    assert set(saved) == {"rand.step.onnx", "rand.pt"}
    assert (tmp_path / "bench" / "halting.png").is_file()
    assert "Early halting" in (tmp_path / "bench" / "report.md").read_text()
