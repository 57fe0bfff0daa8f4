#!/usr/bin/env bash
# The weight-stripped engine stage: run it after scripts/device_check.sh on a machine with a CUDA GPU
# and standard TensorRT (a Jetson board with JetPack, or a GPU machine with the tensorrt package). Builds
# the full and the weight-stripped FP16 engine of the Sudoku-size step graph, checks the stripped plan
# is <= 10 % of the full one, refits it on first run and compares its outputs bit for bit with the full
# engine's (scripts/device_strip_refit.py). Without a GPU, or without TensorRT, it says so and exits 0.
#   scripts/device_strip_refit.sh [--graph STEP.onnx] [--budget SECONDS]   (PYTHON=... picks the interpreter)
# device_strip_refit.json + .md under $OUT (or benchmarks/results/device_check/).
. "$(dirname "$0")/gpu_preamble.sh"
exec "$PY" scripts/device_strip_refit.py "${OUT:-benchmarks/results/device_check}" "$@"
