"""Run one of upstream HRM's dataset builders unmodified on local CSVs (see README.md here).

    python run_upstream.py SCRIPT SEED CSV_FOLDER [the script's own options]

Only ``huggingface_hub.hf_hub_download`` is redirected (to ``CSV_FOLDER/<split>.csv``), and numpy's
global generator is seeded with SEED (upstream never seeds it); then SCRIPT runs as ``__main__``.
"""

import os
import runpy
import sys

import huggingface_hub
import numpy as np


def main() -> None:
    script, seed, csv_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    sys.argv = [script, *sys.argv[4:]]
    huggingface_hub.hf_hub_download = lambda repo_id, filename, repo_type=None, **kw: os.path.join(csv_dir, filename)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    np.random.seed(seed)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
