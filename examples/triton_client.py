"""Solve Sudoku on a running `hrm-deploy serve` (or a triton-repo model) over HTTP.

    hrm-deploy export -o export/sudoku-tiny.onnx
    hrm-deploy serve export/sudoku-tiny.onnx &          # loopback, ports 8000/8001/8002
    python examples/triton_client.py --url http://127.0.0.1:8000 -n 4

Needs only numpy, tritonclient[http] and hrm_deploy's light core on the client side.
"""

from __future__ import annotations

import argparse

import numpy as np

from hrm_deploy.data.sudoku import SudokuSpec, generate_sudoku
from hrm_deploy.serve.client import infer_remote


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="hrm")
    parser.add_argument("-n", type=int, default=4, help="puzzles to send in one request")
    args = parser.parse_args()
    test = generate_sudoku(SudokuSpec(train=0, test=args.n, blanks=(3, 6), seed=1, workers=1))["test"]
    out = infer_remote(args.url, {"inputs": test.inputs.astype(np.int32),
                                  "puzzle_identifiers": test.puzzle_identifiers.astype(np.int32)},
                       model_name=args.model, timeout_s=30)
    solved = (out["answer"] == test.labels).all(axis=1)
    for i, ok in enumerate(solved):
        # tokens: 1 = blank, 2..10 = digits 1..9
        grid = "".join(str(d - 1) for d in out["answer"][i])
        print(f"puzzle {i}: {'solved' if ok else 'wrong '} {grid}  ({int(out['steps'][i])} ACT steps)")
    print(f"{int(solved.sum())}/{len(solved)} solved")


if __name__ == "__main__":
    main()
