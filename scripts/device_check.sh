#!/usr/bin/env bash
# The one GPU check: run it first whenever a machine with a CUDA GPU is at hand.
#   scripts/device_check.sh            (no arguments; PYTHON=... picks the interpreter)
# It runs from the source tree (PYTHONPATH=., nothing installed or downloaded): the GPU tests
# (pytest -m gpu), the GPU latency benchmark (reference, AOTInductor step engine with the captured
# loop, AOTInductor unrolled engine; batch 1, 64, 1024; Sudoku-size) and verify of an AOTInductor
# engine of the bundled model on CUDA, then FP8 and NVFP4 TensorRT engines of it built and verified
# where TensorRT is installed and the GPU's compute capability allows (>= 8.9, >= 10.0; skipped with
# the reason otherwise, within the same time budget); one line per check, and a JSON + Markdown summary under
# $OUT (or benchmarks/results/ when $OUT is unset). About 6-8 minutes on one H100.
# Without a GPU it says so and exits 0.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "no CUDA GPU: nothing to check"
  exit 0
fi
missing=$("$PY" -c "
import importlib.util as u
need = {'numpy': 'numpy', 'typer': 'typer', 'rich': 'rich', 'yaml': 'pyyaml', 'pytest': 'pytest'}
print(' '.join(p for m, p in need.items() if u.find_spec(m) is None))")
if [ -n "$missing" ]; then
  echo "device check needs Python packages missing here: $missing (carry them as wheels, see docs/gpu.md)"
  exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$PY" scripts/device_check.py "${OUT:-benchmarks/results}"
