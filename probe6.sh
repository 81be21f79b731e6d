#!/usr/bin/env bash
# Device probe for seg-slices (branch only): several key slices a block of the segmented attention.
set -uo pipefail
bash scripts/unbundle.sh
B=.gpu-bundle
O=${OUT:-/tmp}
xz -dc .gpu-ab/dspark-ws.xz > /tmp/base && chmod +x /tmp/base
nvidia-smi --query-gpu=name --format=csv,noheader
$B/gpu_model --test-threads=1 batched activations 2>&1 | grep -E "result|FAIL|panick" | tail -5
$B/gpu_kernels --test-threads=1 attention 2>&1 | grep -E "result|FAIL|panick" | tail -3
n=0
for v in new one base new one base; do
  echo "== $v"
  bin=$B/dspark; pre=""; [ $v = base ] && bin=/tmp/base; [ $v = one ] && pre="DSPARK_SEG_SLICES=1"
  n=$((n+1))
  env $pre $bin bench --concurrency 1,4,8,16 --concurrency-only --contexts 512 --iters 3 --kv-cache bf16 --activations bf16 2>/dev/null > $O/conc-$v-$n.md
  grep -E '^\| [0-9]+ \| 512' $O/conc-$v-$n.md
done
$B/dspark bench --concurrency 8 --concurrency-only --contexts 512 --iters 3 --kv-cache bf16 --activations bf16 2>/dev/null > $O/conc8-new.md
$B/dspark bench --concurrency 4,8 --concurrency-only --contexts 4096 --iters 3 --kv-cache bf16 --activations bf16 2>/dev/null | grep -E '^\| [0-9]+ \| 4096'
/tmp/base bench --concurrency 4,8 --concurrency-only --contexts 4096 --iters 3 --kv-cache bf16 --activations bf16 2>/dev/null | grep -E '^\| [0-9]+ \| 4096'
