#!/usr/bin/env bash
# Runs `dspark bench` from .gpu-bundle/ (built by `cargo xtask test --gpu`) on a machine with an
# NVIDIA GPU: Qwen3-8B / DSpark-8B shapes with random weights, every phase against the copy
# ceiling of the same run. Writes $OUT/bench.json and $OUT/bench.md (or ./bench-logs/) and
# prints the markdown report. Extra arguments go to `dspark bench` (e.g. --contexts 512).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/bench-logs}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
.gpu-bundle/dspark bench --json "$out/bench.json" "$@" | tee "$out/bench.md"
