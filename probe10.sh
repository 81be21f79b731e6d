#!/usr/bin/env bash
# Device probe for attn-tf32 (branch only): one TF32 MMA a product in the bf16 mode's attention.
set -uo pipefail
bash scripts/unbundle.sh >/dev/null 2>&1
B=.gpu-bundle
$B/gpu_kernels --test-threads=1 attention 2>&1 | grep -E "test result|FAIL|panick" | tail -4
$B/gpu_model --test-threads=1 activations 2>&1 | grep -E "test result|FAIL|panick" | tail -4
for v in new base; do
  pre=""; [ $v = base ] && pre="DSPARK_ATTN_3XTF32=1"
  echo "== $v"
  env $pre $B/dspark bench --concurrency 1,8 --concurrency-only --contexts 512 --iters 3 --kv-cache bf16 --activations bf16 2>/dev/null | grep -E '^\| [0-9]+ \| 512'
done
