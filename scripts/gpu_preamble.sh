# Sourced by the GPU check scripts: run from the repository root with $PY (PYTHON=... picks it), or
# say there is no CUDA GPU and exit 0 (a check that cannot run is not a failure on a CPU machine).
set -u
cd "$(dirname "${BASH_SOURCE[1]}")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "no CUDA GPU: nothing to check"
  exit 0
fi
