#!/usr/bin/env bash
# Device probe for row-gemm (branch only): the bf16 mode's projections on cuBLASLt GEMMs.
set -uo pipefail
bash scripts/unbundle.sh >/dev/null 2>&1
B=.gpu-bundle
export DSPARK_ROOT=$PWD
O=${OUT:-/tmp}
nvidia-smi --query-gpu=name --format=csv,noheader
$B/gpu_kernels --test-threads=1 row_gemm 2>&1 | grep -E "test result|FAIL|panick|assert" | tail -6
$B/gpu_model --test-threads=1 2>&1 | grep -E "test result|FAIL|panick|assert" | tail -12
for r in 1 2; do
for v in new base; do
  pre=""; [ $v = base ] && pre="DSPARK_NO_ROW_GEMM=1"
  echo "== $v $r"
  log=""; [ $v$r = new1 ] && log="DSPARK_ROW_GEMM_LOG=1"
  env $pre $log $B/dspark bench --concurrency 1,4,8,16 --concurrency-only --contexts 512 --iters 3 --kv-cache bf16 --activations bf16 > $O/bench-$v-$r.txt 2>&1
  grep -E '^\| [0-9]+ \| 512|^row GEMM' $O/bench-$v-$r.txt
done
done
# The single request in the default f32 mode, and 8 requests' profile in the GEMM mode.
$B/dspark bench --concurrency 1 --concurrency-only --contexts 512 --iters 3 --kv-cache bf16 > $O/bench-f32-1.txt 2>&1
grep -E '^\| [0-9]+ \| 512' $O/bench-f32-1.txt
$B/dspark bench --concurrency 8 --concurrency-only --contexts 512 --iters 3 --kv-cache bf16 --activations bf16 > $O/bench-prof8.txt 2>&1
grep -A16 "Profile: batched_target_8" $O/bench-prof8.txt | head -18
