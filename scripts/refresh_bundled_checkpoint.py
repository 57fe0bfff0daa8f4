"""Re-make a bundled checkpoint ``hrm_deploy/train/presets/<preset>.pt``: generate the
preset's dataset, train the preset (on CPU unless --device says otherwise), and keep
weights + provenance (model and train config, dataset spec, final metrics, training time)
without optimizer state.

For a preset with more than one ACT step (sudoku-small) it also measures, on held-out
puzzles of the same spec from another seed (the preset's ``heldout``), the exact accuracy
after every ACT step and what the learned Q-head would save, stores them in the
checkpoint (``act_report``) and writes ``benchmarks/results/<preset>_preset.json``.

    python scripts/refresh_bundled_checkpoint.py [--preset sudoku-small] [--workdir /tmp/bundle] [--threads 1]
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import shutil
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="sudoku-tiny", help="sudoku-tiny, sudoku-small or trm-sudoku-small")
    parser.add_argument("--workdir", default=None, help="scratch folder (default /tmp/<preset>-bundle)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads (0: torch's default); on a shared CPU 1 is often fastest",
    )
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch

    from hrm_deploy.data.format import load_split
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.io import write_json
    from hrm_deploy.model.checkpoint import (
        model_from_contents,
        read_checkpoint,
        save_checkpoint,
    )
    from hrm_deploy.train.act_eval import act_report, step_outcomes
    from hrm_deploy.train.loop import TrainConfig, train
    from hrm_deploy.train.presets import preset, preset_model_config

    chosen = preset(args.preset)
    bundled = ROOT / "hrm_deploy" / "train" / "presets" / f"{args.preset}.pt"
    work = Path(args.workdir or f"/tmp/{args.preset}-bundle")
    shutil.rmtree(work, ignore_errors=True)
    spec = SudokuSpec(**chosen["data"])
    t0 = time.perf_counter()
    generate_sudoku(spec, str(work / "data"))
    generate_s = time.perf_counter() - t0
    model_config = preset_model_config(args.preset, seq_len=81, vocab_size=11, num_puzzle_identifiers=1)
    config = TrainConfig(
        data_path=str(work / "data"),
        out_dir=str(work / "run"),
        device=args.device,
        threads=args.threads,
        **chosen["train"],
    )
    t0 = time.perf_counter()
    result = train(model_config, config)
    train_s = time.perf_counter() - t0
    contents = read_checkpoint(result.checkpoint)
    model = model_from_contents(contents)
    provenance: dict = {
        "dataset": {"generator": "sudoku", **dataclasses.asdict(spec)},
        "training": {
            "wall_s": round(train_s, 1),
            "generate_s": round(generate_s, 1),
            "device": args.device,
            "threads": torch.get_num_threads(),
            "torch": str(torch.__version__),
            "machine": platform.machine(),
            "script": "scripts/refresh_bundled_checkpoint.py",
        },
    }
    report = None
    if model_config.halt_max_steps > 1 and "heldout" in chosen:
        heldout = SudokuSpec(**{**chosen["data"], **chosen["heldout"]})
        generate_sudoku(heldout, str(work / "heldout"))
        report = act_report(step_outcomes(model, load_split(work / "heldout", "test")))
        provenance["heldout"] = {"generator": "sudoku", **dataclasses.asdict(heldout)}
        provenance["act_report"] = report
    save_checkpoint(
        bundled,
        model,
        step=contents.step or 0,
        train_config=contents.train_config,
        metrics=result.metrics,
        **provenance,
    )
    print(
        f"wrote {bundled} ({bundled.stat().st_size / 1e6:.2f} MB): test exact accuracy "
        f"{result.metrics['eval']['exact_accuracy']:.3f}, trained in {train_s / 60:.1f} min"
    )
    if report is not None:
        results = {
            "preset": args.preset,
            "checkpoint": str(bundled.relative_to(ROOT)),
            "model": chosen["model"],
            "train": chosen["train"],
            **provenance,
            "train_final": {k: v for k, v in result.metrics.items() if k != "eval"},
            "test_eval_unrolled": result.metrics.get("eval"),
        }
        out = ROOT / "benchmarks" / "results" / f"{args.preset.replace('-', '_')}_preset.json"
        write_json(out, results)
        print(f"wrote {out}: per-step exact {report['per_step_exact_accuracy']}")


if __name__ == "__main__":
    main()
