#!/usr/bin/env bash
# One device call's worth of measurements for the bf16 KV cache (`--kv-cache bf16`): the two
# split-attention kernels alone on a bf16 cache against the f32 ones on the same rounded values
# (scripts/exp/attn_bf16.cu: times and a bit-for-bit check), then the model phases with
# `--kv-cache f32` and `--kv-cache bf16` alternated ROUNDS times (scripts/ab.sh) at ctx 512 and
# 4096. Needs .gpu-bundle/dspark (cargo xtask test --gpu) and nvcc. Run the GPU tier first.
set -euo pipefail
cd "$(dirname "$0")/../.."
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/attn_bf16.cu -o /tmp/attn_bf16
for mode in q1 tc; do
    for ctx in 512 4096; do
        /tmp/attn_bf16 "$mode" "$ctx"
    done
done
wrap=/tmp/dspark-kv-ab
mkdir -p "$wrap"
for kv in f32 bf16; do
    printf '#!/bin/sh\nexec %s/.gpu-bundle/dspark "$@" --kv-cache %s\n' "$PWD" "$kv" > "$wrap/kv-$kv"
    chmod +x "$wrap/kv-$kv"
done
AB_DIR="$wrap" AB_BINS="kv-f32 kv-bf16" ROUNDS="${ROUNDS:-3}" bash scripts/ab.sh --contexts 512,4096
