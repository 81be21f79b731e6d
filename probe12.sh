#!/usr/bin/env bash
# Device probe for row-gemm (branch only): the whole GPU tier, then one A/B round and 8 requests' profile.
set -uo pipefail
O=${OUT:-/tmp}
GPU_TIER_LOGS=$O/logs timeout 430 bash scripts/gpu-tier.sh > $O/tier.txt 2>&1
tail -14 $O/tier.txt
B=.gpu-bundle
for v in new base; do
  pre=""; [ $v = base ] && pre="DSPARK_NO_ROW_GEMM=1"
  echo "== $v"
  env $pre $B/dspark bench --concurrency 1,4,8,16 --concurrency-only --contexts 512 --iters 3 --kv-cache bf16 --activations bf16 > $O/bench-$v.txt 2>&1
  grep -E '^\| [0-9]+ \| 512' $O/bench-$v.txt
done
$B/dspark bench --concurrency 8 --concurrency-only --contexts 512 --iters 3 --kv-cache bf16 --activations bf16 > $O/bench-prof8.txt 2>&1
grep -A10 "Profile: batched_target_8" $O/bench-prof8.txt | head -12
