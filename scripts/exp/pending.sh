#!/usr/bin/env bash
# The kernel experiments written without device time, in one call (each prints its own check):
# the split-attention kernels on a bf16 cache against the f32 ones (attn_bf16.cu), and the
# decode kernel's PV4 variant against the shipped one (attn.cu with PV4=1), at ctx 512 and 4096
# on the engine's grids. Needs nvcc; no Rust build.
set -euo pipefail
cd "$(dirname "$0")/../.."
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/attn_bf16.cu -o /tmp/attn_bf16
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/attn.cu -o /tmp/attn
for ctx in 512 4096; do
    /tmp/attn_bf16 q1 "$ctx"
    /tmp/attn_bf16 tc "$ctx"
done
# The engine's decode grid: 32-key slices, one wave (4 blocks per SM on 132 SMs, 8 KV heads).
PV4=1 KEYS=32 SPLITS=16 /tmp/attn q1 512
PV4=1 KEYS=32 SPLITS=66 /tmp/attn q1 4096
