#!/usr/bin/env bash
# The second, optional GPU check (after scripts/device_check.sh): the user's path with the bundled
# model's CUDA engine, built once and used from fresh processes (verify, solve, bench, serve), the
# load matrix's cause variants when a load fails (or --diagnose), pytest -m gpu, then what fits of
# TF32/bf16 engines and FP8/NVFP4. At most 7 minutes on one H100.
#   scripts/device_check_bundled.sh [--diagnose | --no-diagnose] [--budget SECONDS]   (PYTHON=... picks it)
# One line per check; device_check_bundled.json + .md under $OUT (or benchmarks/results/), rewritten
# after every stage. Without a GPU it says so and exits 0.
. "$(dirname "$0")/gpu_preamble.sh"
exec "$PY" scripts/device_check_bundled.py "${OUT:-benchmarks/results}" "$@"
