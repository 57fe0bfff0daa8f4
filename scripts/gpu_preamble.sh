# Sourced by the GPU check scripts: run from the repository root with $PY (PYTHON=... picks it), or
# say there is no CUDA GPU and exit 0 (a check that cannot run is not a failure on a CPU machine);
# name the Python packages a check needs that are missing (exit 2); PYTHONPATH is the source tree.
set -u
cd "$(dirname "${BASH_SOURCE[1]}")/.."
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
