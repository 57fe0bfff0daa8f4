"""One call per answer or a host loop? The three graph forms on ONNX Runtime CPU, in one run.

Forms, each measured end to end through the ORT runner (host arrays in and out):

* ``unrolled``: every ACT step copied into one graph (always all steps);
* ``step+host``: the single-step graph driven by the host loop (halting rows leave the batch);
* ``loop``: ``export --mode loop``, the ACT loop inside the graph (an ONNX ``Loop``), the batch
  stops when its last row halts.

Halting ``off`` (every step) and ``q`` (the model's training rule; ``loop`` exported with it) at
batch 1, 8 and 64. Models: the bundled trained ``sudoku-small`` (8 steps, real halting) and the
Sudoku-size model (``benchmarks/sudoku_size.py``: hidden 512, 16 steps, random weights: its
halting is arbitrary, its rows measure the cost of the forms; batch 64 left out, a call takes
minutes on 2 cores). Points are interleaved round by round (load falls on all forms alike); the
median per point is kept. ``Loop``'s own cost per iteration (ONNX Runtime runs a subgraph per
iteration) is read from ``loop`` against ``unrolled`` with halting off: the same kernels, so the
difference over the steps is the loop machinery.

    nice python benchmarks/loop_modes.py [--models bundled,sudoku] [--rounds 5]
Writes benchmarks/results/loop_modes.json (+ .md, + loop_modes.png).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BATCHES = {"bundled": (1, 8, 64), "sudoku": (1, 8)}
FORMS = ("unrolled", "step+host", "loop")
BLOCK_S = 0.4  # each point's share of a round: calls until this long (at least one)


def _puzzles(n: int, blanks: tuple[int, int], seed: int = 7) -> dict[str, np.ndarray]:
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku

    split = generate_sudoku(SudokuSpec(train=0, test=n, blanks=blanks, augment=0, seed=seed))["test"]
    return {"inputs": split.inputs.astype(np.int32), "puzzle_identifiers": np.zeros(n, np.int32)}


def _graphs(name: str, folder: Path) -> tuple[dict[tuple[str, str], Path], tuple[int, int], Any]:
    """(form, halting) -> ONNX path; the puzzles' blanks; the checkpoint."""
    from hrm_deploy.export.onnx_export import ExportConfig, export_onnx
    from hrm_deploy.model.checkpoint import save_checkpoint
    from hrm_deploy.train.presets import bundled_checkpoint

    if name == "bundled":
        ckpt, blanks = bundled_checkpoint("sudoku-small"), (10, 30)
    else:
        from sudoku_size import sudoku_size_model

        ckpt, blanks = str(save_checkpoint(folder / "sudoku-random.pt", sudoku_size_model(seed=0))), (40, 50)
    paths = {}
    for form, mode, halt in (("unrolled", "unrolled", "off"), ("step+host", "step", "off"), ("loop", "loop", "off")):
        out = folder / f"{name}.{mode}.onnx"
        export_onnx(ckpt, out, ExportConfig(mode=mode, halt=halt, max_batch=64), quiet=True)
        paths[(form, "off")] = out
    out = folder / f"{name}.loop-q.onnx"
    export_onnx(ckpt, out, ExportConfig(mode="loop", halt="q", max_batch=64), quiet=True)
    paths[("loop", "q")] = out
    paths[("step+host", "q")] = paths[("step+host", "off")]
    return paths, blanks, ckpt


def measure(name: str, rounds: int, folder: Path) -> list[dict[str, Any]]:
    from hrm_deploy.backends import open_runner
    from hrm_deploy.halting import resolve_rule

    paths, blanks, _ = _graphs(name, folder)
    runners = {key: open_runner(path) for key, path in paths.items()}
    for runner in runners.values():
        runner.activate()
    halt_q = resolve_rule("q", str(paths[("step+host", "off")])).should_halt
    points = [(form, halting, batch) for batch in BATCHES[name] for form in FORMS for halting in ("off", "q")]
    points = [p for p in points if not (p[0] == "unrolled" and p[1] == "q")]  # the unroll cannot halt
    times: dict[tuple[str, str, int], list[float]] = {p: [] for p in points}
    steps: dict[tuple[str, str, int], float] = {}
    feeds = {batch: _puzzles(batch, blanks) for batch in BATCHES[name]}
    for _ in range(rounds):
        for point in points:
            form, halting, batch = point
            runner, halt = runners[(form, halting)], halt_q if (form, halting) == ("step+host", "q") else None
            end = time.perf_counter() + BLOCK_S
            while True:
                t0 = time.perf_counter()
                out = runner.infer(feeds[batch], halt=halt) if halt else runner.infer(feeds[batch])
                times[point].append(time.perf_counter() - t0)
                if time.perf_counter() >= end:
                    break
            steps[point] = float(np.mean(out["steps_used"]))
    for runner in runners.values():
        runner.close()
    rows = []
    for point in points:
        form, halting, batch = point
        ms = 1e3 * statistics.median(times[point])
        rows.append(
            {
                "model": name,
                "form": form,
                "halt": halting,
                "batch": batch,
                "median_ms": round(ms, 3),
                "puzzles_per_s": round(batch / ms * 1e3, 1),
                "mean_steps": steps[point],
                "calls": len(times[point]),
            }
        )
    return rows


def _per_iteration(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """ms per ACT step that ``loop`` costs beyond ``unrolled`` (halting off: the same kernels)."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        if r["form"] == "loop" and r["halt"] == "off":
            base = next(u for u in rows if (u["model"], u["form"], u["batch"]) == (r["model"], "unrolled", r["batch"]))
            out.setdefault(r["model"], {})[str(r["batch"])] = round(
                (r["median_ms"] - base["median_ms"]) / r["mean_steps"], 3
            )
    return out


def _markdown(result: dict[str, Any]) -> str:
    lines = [
        "| model | form | halt | batch | median ms | puzzles/s | mean steps |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['model']} | {r['form']} | {r['halt']} | {r['batch']} | {r['median_ms']:.2f} | "
            f"{r['puzzles_per_s']:.1f} | {r['mean_steps']:.2f} |"
        )
    lines += ["", f"Loop cost per ACT step beyond the unrolled graph (ms): {result['loop_ms_per_step']}"]
    return "\n".join(lines) + "\n"


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({r["model"] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes[0], models):
        for form in FORMS:
            for halting, style in (("off", "-"), ("q", "--")):
                pts = [r for r in result["rows"] if (r["model"], r["form"], r["halt"]) == (model, form, halting)]
                if pts:
                    ax.plot(
                        [p["batch"] for p in pts],
                        [p["median_ms"] for p in pts],
                        style,
                        marker="o",
                        label=f"{form}, halt {halting}",
                    )
        ax.set(xscale="log", yscale="log", xlabel="batch", ylabel="median ms per call", title=f"{model} (ORT CPU)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bundled,sudoku")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "loop_modes.json"))
    args = parser.parse_args()
    from hrm_deploy.backends.ort.builder.isa import isa_flags

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            rows += measure(name, args.rounds, Path(tmp))
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    result = {
        "machine": {"cpu": cpu, "isa": isa_flags(), "python": platform.python_version()},
        "rounds": args.rounds,
        "rows": rows,
        "loop_ms_per_step": _per_iteration(rows),
    }
    out = Path(args.out)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(_markdown(result))
    _plot(result, out.with_suffix(".png"))
    print(_markdown(result))


if __name__ == "__main__":
    main()
