"""``bench`` on an ARC dataset: ARC tasks/s at each artifact's best batch, from its puzzles/s and the
test split's rows per task."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hrm_deploy.bench.arc_tasks import add_task_rates, task_rates_markdown
from hrm_deploy.data.arc_tasks import arc_test_workload
from tests.arc.conftest import small_arc_dataset

# the test split of the conftest dataset: 2 evaluation tasks with 1 and 2 test inputs, each as given
# and in 3 augmented copies (num_aug=3): 12 rows over 2 tasks
ROWS, TASKS = 12, 2


def test_workload_of_an_arc_dataset_and_none_for_other_data(tmp_path):
    data, _ = small_arc_dataset(tmp_path)
    workload = arc_test_workload(data)
    assert workload is not None and (workload.rows, workload.tasks) == (ROWS, TASKS)
    assert workload.rows_per_task == ROWS / TASKS
    np.savez(tmp_path / "rows.npz", inputs=np.zeros((4, 25), np.int32))
    assert arc_test_workload(tmp_path / "rows.npz") is None and arc_test_workload(tmp_path) is None
    # the same folder with another vocabulary (Sudoku's is 11) is not ARC data
    meta = data / "test" / "dataset.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "vocab_size": 13}))
    assert arc_test_workload(data) is None


def test_best_batch_is_the_highest_puzzles_per_s_and_skipped_rows_get_none(tmp_path):
    data, _ = small_arc_dataset(tmp_path)
    rows = [
        {"artifact": "a.onnx", "runner": "ort", "status": "ok", "batches": {"1": {"puzzles_per_s": 30.0}, "4": {"puzzles_per_s": 90.0}, "8": {"puzzles_per_s": 60.0}}},
        {"artifact": "b.engine", "runner": "tensorrt", "status": "skipped: no GPU"},
    ]  # fmt: skip
    report = {"rows": rows}
    add_task_rates(report, str(data))
    assert report["arc"]["rows_per_task"] == ROWS / TASKS and report["arc"]["tasks"] == TASKS
    assert rows[0]["arc"] == {"batch": 4, "puzzles_per_s": 90.0, "rows_per_task": 6.0, "tasks_per_s": 15.0}
    assert "arc" not in rows[1]
    text = task_rates_markdown(report)
    assert "| ort  a.onnx | 4 | 90.0 | 6.00 | 15 |" in text and "--early-stop" in text and "b.engine" not in text


@pytest.mark.slow
def test_bench_of_an_onnx_artifact_on_arc_data_reports_tasks_per_s(arc_run):
    from hrm_deploy.bench.run import BenchConfig, bench
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx

    checkpoint, data, tmp = arc_run
    onnx = export_onnx(checkpoint, tmp / "model.onnx", ExportConfig(parity=False), quiet=True).path
    out = tmp / "bench"
    config = BenchConfig(data=str(data), batches=(1, 4), iters=2, warmup=0, reference=str(checkpoint), out_dir=str(out))
    report = bench([str(onnx)], config, quiet=True)
    saved = json.loads((out / "report.json").read_text())
    assert saved["arc"]["test_rows"] == ROWS and saved["arc"]["rows_per_task"] == ROWS / TASKS
    assert [row["status"] for row in saved["rows"]] == ["ok", "ok"]  # the artifact and the reference
    for row in saved["rows"]:
        rate, batches = row["arc"], row["batches"]
        best = max(batches, key=lambda b: batches[b]["puzzles_per_s"])
        assert rate["batch"] == int(best) and rate["puzzles_per_s"] == batches[best]["puzzles_per_s"]
        assert rate["tasks_per_s"] == pytest.approx(batches[best]["puzzles_per_s"] * TASKS / ROWS)
    markdown = (out / "report.md").read_text()
    assert "ARC tasks/s" in markdown and f"{ROWS} rows over {TASKS} tasks, 6.00 rows per task" in markdown
    assert report["rows"][0]["arc"] == saved["rows"][0]["arc"]
