#!/usr/bin/env bash
# The one GPU check: run it first whenever a machine with a CUDA GPU is at hand.
#   scripts/device_check.sh [--diagnose | --no-diagnose] [--budget SECONDS]   (PYTHON=... picks the interpreter)
# It runs from the source tree (PYTHONPATH=., nothing installed or downloaded) the user's path in
# at most 7 minutes on one H100 (stages and their order: scripts/device_check.py): the bundled
# model's CUDA engine built once and used from fresh processes (verify, solve, bench, serve), the
# AOTInductor load matrix while diagnosing or when a CLI load fails, a Sudoku-size bf16 engine
# built, verified and timed (kernel time vs launch gaps), pytest -m gpu, then what fits of TF32/bf16
# accuracy, fp32, FP8/NVFP4. One line per check; device_check.json + .md under $OUT (or
# benchmarks/results/), rewritten after every stage. Without a GPU it says so and exits 0.
. "$(dirname "$0")/gpu_preamble.sh"
missing=$("$PY" -c "
import importlib.util as u
need = {'numpy': 'numpy', 'typer': 'typer', 'rich': 'rich', 'yaml': 'pyyaml', 'pytest': 'pytest'}
print(' '.join(p for m, p in need.items() if u.find_spec(m) is None))")
if [ -n "$missing" ]; then
  echo "device check needs Python packages missing here: $missing (carry them as wheels, see docs/gpu.md)"
  exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$PY" scripts/device_check.py "${OUT:-benchmarks/results}" "$@"
