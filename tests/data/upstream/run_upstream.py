"""Run an upstream builder unmodified; only hf_hub_download is redirected to a local CSV folder
and the global numpy RNG is seeded (upstream does not seed)."""
import os, runpy, sys
import numpy as np
script, seed, csv_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.argv = [script] + sys.argv[4:]
import huggingface_hub
huggingface_hub.hf_hub_download = lambda repo_id, filename, repo_type=None, **kw: os.path.join(csv_dir, filename)
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
np.random.seed(seed)
runpy.run_path(script, run_name="__main__")
