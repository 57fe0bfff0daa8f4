#!/usr/bin/env bash
# The GPU check: run it first whenever a machine with a CUDA GPU is at hand (one call, at most 7
# minutes on one H100). It measures what is not known yet: the Sudoku-size (hidden 512, 16 ACT
# steps) bf16 step engine's latency at batch 1/64/1024 on the captured loop with its kernel/gap
# breakdown and verify, bf16/TF32 against exact fp32 on the bundled model, the load probe's verdict
# and, where the probe died, the cause variants of the load crash (stages and their order:
# scripts/device_check.py). Every row says which path ran (the engine or its fallback).
#   scripts/device_check.sh [--diagnose] [--budget SECONDS]   (PYTHON=... picks the interpreter)
# device_check.json + .md under $OUT (or benchmarks/results/), rewritten after every stage.
# The bundled model's build/verify/solve/bench/serve: scripts/device_check_bundled.sh (optional).
# Without a GPU it says so and exits 0.
. "$(dirname "$0")/gpu_preamble.sh"
exec "$PY" scripts/device_check.py "${OUT:-benchmarks/results}" "$@"
