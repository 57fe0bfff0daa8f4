#!/usr/bin/env bash
# Set up hrm-deploy's light runtime on a Jetson Orin or Thor, for the JetPack line the board runs:
#   JetPack 6 (L4T R36, TensorRT 10.3, CUDA 12.6, Python 3.10): the `jetson` extra (cuda-python 12.x)
#   JetPack 7 (L4T R38+, TensorRT 10.x/11.4, CUDA 13, Python 3.12): the `jetson7` extra (cuda-python 13.x)
# The line comes from the nvidia-jetpack package's version, else /etc/nv_tegra_release
# (hrm_deploy/jetpack.py decides; this script says which it chose). The pip `tensorrt` wheel does
# not run on Orin (sm_87): the venv sees JetPack's TensorRT through --system-site-packages. No torch, no onnx.
#   usage: jetson/setup.sh [VENV_DIR]        (default ~/.venvs/hrm-deploy)
#          jetson/setup.sh --detect [ROOT]   (print the line and extra it would install, change nothing)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

if [ "${1:-}" = "--detect" ]; then
  exec "$PYTHON" "$REPO/hrm_deploy/jetpack.py" "${2:-/}"
fi
VENV="${1:-$HOME/.venvs/hrm-deploy}"

# "<extra> <python> <line name> (<source>)", or one error line and exit 2
if ! chosen="$("$PYTHON" "$REPO/hrm_deploy/jetpack.py")"; then
  exit 2
fi
read -r EXTRA WANT_PY LINE <<<"$chosen"
echo "detected $LINE: installing the '$EXTRA' extra"
HAVE_PY="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$HAVE_PY" != "$WANT_PY" ]; then
  echo "error: ${LINE%% (*} runs Python $WANT_PY, but $PYTHON is $HAVE_PY; run with PYTHON=python$WANT_PY" >&2
  exit 2
fi
if ! "$PYTHON" -c "import tensorrt" 2>/dev/null; then
  echo "error: JetPack's TensorRT is not importable by $PYTHON; install it with" >&2
  echo "       sudo apt install nvidia-jetpack   (or python3-libnvinfer)" >&2
  exit 2
fi
"$PYTHON" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "$REPO[$EXTRA]"
"$VENV/bin/python" - <<'PY'
import tensorrt
print(f"hrm-deploy light runtime ready: TensorRT {tensorrt.__version__}")
PY
echo "activate with: source $VENV/bin/activate   then: hrm-deploy doctor"
