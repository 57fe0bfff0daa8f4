#!/usr/bin/env bash
# Set up hrm-deploy's light runtime on a Jetson Orin with JetPack 6 (L4T 36.x, TensorRT 10.3).
# The pip `tensorrt` wheel does not run on Orin (sm_87): the venv sees JetPack's TensorRT
# through --system-site-packages. Installs the core package plus the `jetson` extra
# (cuda-python for device memory); no torch, no onnx.
#   usage: jetson/setup.sh [VENV_DIR]        (default ~/.venvs/hrm-deploy)
set -euo pipefail
VENV="${1:-$HOME/.venvs/hrm-deploy}"
REPO="$(cd "$(dirname "$0")/.." && pwd)"

if [ ! -f /etc/nv_tegra_release ]; then
  echo "error: this is not a Jetson (no /etc/nv_tegra_release); build engines on your desktop instead" >&2
  exit 2
fi
if ! python3 -c "import tensorrt" 2>/dev/null; then
  echo "error: JetPack's TensorRT is not importable by the system python3; install it with" >&2
  echo "       sudo apt install nvidia-jetpack   (or python3-libnvinfer)" >&2
  exit 2
fi
python3 -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$REPO[jetson]"
"$VENV/bin/python" - <<'PY'
import tensorrt
print(f"hrm-deploy light runtime ready: TensorRT {tensorrt.__version__}")
PY
echo "activate with: source $VENV/bin/activate   then: hrm-deploy doctor"
