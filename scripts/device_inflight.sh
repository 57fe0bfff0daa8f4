#!/usr/bin/env bash
# A second GPU check, after scripts/device_check.sh: in-flight serving on CUDA and the bisect of
# the AOTInductor fresh-process load crash, in about 5 minutes on one H100 (16 cores).
#   scripts/device_inflight.sh            (PYTHON=... picks the interpreter; results under $OUT or
#                                          benchmarks/results/device_inflight/)
# Phase 1 (<= 150 s): the bundled model's CUDA step engine builds in the background, and so does
# `pytest -m gpu tests/backends/torch/test_torch_inflight.py` (its own engine); meanwhile
# benchmarks/inflight_load.py measures in-flight vs dynamic batching on the bundled checkpoint and
# on the Sudoku-size checkpoint on CUDA. Phase 2 (<= 150 s): the load matrix bisect on the built
# engine (parallel children, repeats) while inflight_load.py measures that engine. At most 8 files
# land in the output folder (the device machine returns no more).
. "$(dirname "$0")/gpu_preamble.sh"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT_DIR=${OUT:-benchmarks/results/device_inflight}
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ENGINE="$WORK/sudoku-small.step.cuda.pt2"
start=$(date +%s)
say() { echo "[$(( $(date +%s) - start )) s] $*"; }

say "phase 1: engine build and gpu test in the background; checkpoints measured"
( timeout 150 "$PY" -m hrm_deploy build-engine hrm_deploy/train/presets/sudoku-small.pt --backend torch \
    -o "$ENGINE" -q; echo "build exit $?" ) >"$OUT_DIR/build.log" 2>&1 &
build=$!
( timeout 280 "$PY" -m pytest -m gpu -q -o addopts=-ra -p no:cacheprovider tests/backends/torch/test_torch_inflight.py;
  echo "pytest exit $?" ) >"$OUT_DIR/pytest.log" 2>&1 &
tests=$!
{
  timeout 70 "$PY" benchmarks/inflight_load.py --device cuda --duration 5 \
    --out "$OUT_DIR/inflight_bundled_cuda.json"; echo "bundled exit $?"
  timeout 75 "$PY" benchmarks/inflight_load.py --device cuda --sudoku-size --duration 5 \
    --out "$OUT_DIR/inflight_sudoku_size_cuda.json"; echo "sudoku-size exit $?"
} >"$OUT_DIR/checkpoints.log" 2>&1
wait "$build"
say "$(tail -n 1 "$OUT_DIR/build.log")"

if [ -f "$ENGINE" ]; then
  say "phase 2: load matrix bisect and the engine measured"
  timeout 140 "$PY" scripts/diagnostics/2026-11-aoti-load/aoti_load_matrix.py "$ENGINE" --jobs 12 --repeat 3 --fast-first --budget 130 \
    --timeout 110 --only runner-extracted,runner-amx,api-amx,runner-cli-imports,runner-import-ort,runner-import-onnx,runner-import-cli,runner-import-verify,runner-import-reference,runner-import-inductor,runner-import-dynamo,runner-cuda-ctx,tool-api,api-cli-imports \
    >"$OUT_DIR/matrix.log" 2>&1 &
  matrix=$!
  timeout 140 "$PY" benchmarks/inflight_load.py --artifact "$ENGINE" --device cuda --duration 5 \
    --out "$OUT_DIR/inflight_engine_cuda.json" >"$OUT_DIR/engine.log" 2>&1
  echo "engine exit $?" >>"$OUT_DIR/engine.log"
  wait "$matrix"
fi
wait "$tests"
say "done: $(tail -n 1 "$OUT_DIR/pytest.log")"
