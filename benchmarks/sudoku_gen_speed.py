"""Sudoku generator throughput: N unique-solution puzzles at a given difficulty.

    python benchmarks/sudoku_gen_speed.py [--puzzles 10000] [--min-blanks 10] [--max-blanks 20]
Writes benchmarks/results/sudoku_gen_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--puzzles", type=int, default=10000)
    parser.add_argument("--min-blanks", type=int, default=10)
    parser.add_argument("--max-blanks", type=int, default=20)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--out", default="benchmarks/results/sudoku_gen_speed.json")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        spec = SudokuSpec(
            train=args.puzzles - args.puzzles // 10,
            test=args.puzzles // 10,
            blanks=(args.min_blanks, args.max_blanks),
            seed=0,
            workers=args.workers,
        )
        start = time.perf_counter()
        generate_sudoku(spec, str(Path(tmp) / "data"))
        seconds = time.perf_counter() - start
        results.append(
            {
                "puzzles": args.puzzles,
                "blanks": [args.min_blanks, args.max_blanks],
                "workers": spec.workers or os.cpu_count(),
                "seconds": round(seconds, 2),
                "puzzles_per_s": round(args.puzzles / seconds, 1),
            }
        )
    out = {"cpus": os.cpu_count(), "results": results}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
