#!/usr/bin/env bash
# Device probe for split-deep (branch only): three weight steps in flight in the 32-row split kernels.
set -uo pipefail
bash scripts/unbundle.sh
B=.gpu-bundle
O=${OUT:-/tmp}
xz -dc .gpu-ab/dspark-ws.xz > /tmp/base && chmod +x /tmp/base
nvidia-smi --query-gpu=name --format=csv,noheader
$B/gpu_kernels --test-threads=1 wide 2>&1 | grep -E "result|FAIL|panick" | tail -3
$B/gpu_model --test-threads=1 activations batched 2>&1 | grep -E "result|FAIL|panick" | tail -3
for v in new base new base; do
  echo "== $v"
  bin=$B/dspark; [ $v = base ] && bin=/tmp/base
  $bin bench --concurrency 1,4,8 --concurrency-only --contexts 512 --iters 3 --kv-cache bf16 --activations bf16 2>/dev/null | grep -E '^\| [0-9]+ \| 512'
done
for v in new base; do
  bin=$B/dspark; [ $v = base ] && bin=/tmp/base
  echo "== proj 32 $v"
  $bin bench --projections-only --projection-rows 32 --activations bf16 --iters 5 2>/dev/null | grep -E '^\| (q|o|qkv|gate|down)_proj \||^\| (fc|lm_head) \|' | awk -F'|' '{printf "%s %s;", $2, $5} END {print ""}'
done
