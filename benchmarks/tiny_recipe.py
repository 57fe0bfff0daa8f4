"""Recipe search for the CPU ``sudoku-tiny`` preset: train several variants side by side,
each in its own process pinned to ``--threads`` CPU threads, and record the held-out exact
accuracy curve and wall time of each.

    python benchmarks/tiny_recipe.py --variants benchmarks/tiny_variants.json --parallel 8
Writes benchmarks/results/tiny_recipe.json. The variant list is JSON: name -> {"model": {...},
"train": {...}, "data": {...}} overrides of the sudoku-tiny preset.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def run_variant(name: str, variant: dict, workdir: str, threads: int) -> dict:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    torch.set_num_threads(threads)
    from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
    from hrm_deploy.model.config import HRMConfig
    from hrm_deploy.train.loop import TrainConfig, train
    from hrm_deploy.train.presets import preset

    chosen = preset("sudoku-tiny")
    data_spec = {"train": 5000, "test": 300, "blanks": [3, 6], "augment": 0, "seed": 0, **variant.get("data", {})}
    data_dir = Path(workdir) / ("data-" + "-".join(str(v) for v in data_spec.values()).replace(" ", ""))
    if not data_dir.exists():
        tmp = data_dir.with_suffix(f".{os.getpid()}")
        generate_sudoku(SudokuSpec(**{**data_spec, "blanks": tuple(data_spec["blanks"])}), str(tmp))
        try:
            tmp.rename(data_dir)
        except OSError:
            pass  # another variant made it first
    model_config = HRMConfig(seq_len=81, vocab_size=11, **{**chosen["model"], **variant.get("model", {})})
    cfg = TrainConfig(
        data_path=str(data_dir),
        out_dir=str(Path(workdir) / name),
        device="cpu",
        threads=threads,
        **{**chosen["train"], **variant.get("train", {})},
    )
    start = time.perf_counter()
    result = train(model_config, cfg, progress=False)
    elapsed = time.perf_counter() - start
    curve = []
    for line in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "eval" in row:
            curve.append(
                {"step": row["step"], "exact": row["eval"]["exact_accuracy"], "token": row["eval"]["token_accuracy"]}
            )
    final = result.metrics["eval"]
    return {
        "name": name,
        "variant": variant,
        "seconds": round(elapsed, 1),
        "curve": curve,
        "final_exact": final["exact_accuracy"],
        "final_token": final["token_accuracy"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--variants", required=True)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", default="/tmp/tiny-recipe")
    parser.add_argument("--out", default="benchmarks/results/tiny_recipe.json")
    args = parser.parse_args()
    variants = json.loads(Path(args.variants).read_text())
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(args.parallel) as pool:
        futures = [pool.submit(run_variant, n, v, args.workdir, args.threads) for n, v in variants.items()]
        results = []
        for f in futures:
            r = f.result()
            results.append(r)
            print(json.dumps({k: r[k] for k in ("name", "seconds", "final_exact", "final_token")}), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps(
            {
                "machine": platform.node(),
                "cpus": os.cpu_count(),
                "threads_per_run": args.threads,
                "parallel": args.parallel,
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
