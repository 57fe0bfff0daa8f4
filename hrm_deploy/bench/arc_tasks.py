"""ARC tasks/s in the bench report: when the benched data is an ARC dataset, each measured row's
puzzles/s at its best batch (its highest puzzles/s) divided by the test split's rows per task.

``arc-eval`` runs every test input of a task in all its augmented copies, each for all ACT steps,
and votes; a task therefore costs (test rows / tasks) rows, and bench's puzzles/s (rows/s, all ACT
steps) gives the tasks/s of an ``arc-eval`` run at that batch. ``--early-stop`` (fewer rows) and
``--halt`` (fewer ACT steps per row) can run less per task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hrm_deploy.bench.common import row_label

NOTE = (
    "tasks/s = puzzles/s at the artifact's best batch / the test split's rows per task (every test input in "
    "every augmented copy, all ACT steps, as arc-eval runs them); arc-eval --early-stop or --halt can run "
    "fewer rows or steps per task, so more tasks/s"
)


def add_task_rates(report: dict[str, Any], data: str | Path | None) -> None:
    """With ``data`` an ARC dataset folder, ``report["arc"]`` (the test split's rows, tasks, rows
    per task) and each measured row's ``arc`` entry (best batch, its puzzles/s, tasks/s); other
    data leaves ``report`` as it is."""
    from hrm_deploy.data.arc_tasks import arc_test_workload

    workload = arc_test_workload(data) if data is not None else None
    if workload is None:
        return
    per_task = workload.rows_per_task
    report["arc"] = {
        "data": workload.data,
        "test_rows": workload.rows,
        "tasks": workload.tasks,
        "rows_per_task": per_task,
        "note": NOTE,
    }
    for row in report["rows"]:
        batches = row.get("batches") or {}
        if row.get("status") != "ok" or not batches:
            continue
        batch, stats = max(batches.items(), key=lambda item: item[1]["puzzles_per_s"])
        row["arc"] = {
            "batch": int(batch),
            "puzzles_per_s": stats["puzzles_per_s"],
            "rows_per_task": per_task,
            "tasks_per_s": stats["puzzles_per_s"] / per_task,
        }


def task_rates_markdown(report: dict[str, Any]) -> str:
    """The report's ARC tasks/s section ("" for data that is not ARC)."""
    arc = report.get("arc")
    if not arc:
        return ""
    lines = [
        f"\nARC tasks/s at each artifact's best batch (its highest puzzles/s): the test split of {arc['data']} "
        f"has {arc['test_rows']:,} rows over {arc['tasks']:,} tasks, {arc['rows_per_task']:.2f} rows per task.\n",
        "| Format | Best batch | puzzles/s | rows per task | tasks/s |",
        "|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        rate = row.get("arc")
        if rate:
            lines.append(
                f"| {row_label(row)} | {rate['batch']} | {rate['puzzles_per_s']:.1f} | "
                f"{rate['rows_per_task']:.2f} | {_rate(rate['tasks_per_s'])} |"
            )
    lines.append(f"\n{arc['note']}.")
    return "\n".join(lines) + "\n"


def _rate(value: float) -> str:
    """Four significant digits below 100 (upstream's ~1,000 copies per task give fractions), else one decimal."""
    return f"{value:,.1f}" if value >= 100 else f"{value:.4g}"
