#!/usr/bin/env bash
# Device probe for o-rows (branch only): the attention's output as bf16 rows for o_proj.
set -uo pipefail
bash scripts/unbundle.sh
B=.gpu-bundle
O=${OUT:-/tmp}
xz -dc .gpu-ab/dspark-ws.xz > /tmp/base && chmod +x /tmp/base
nvidia-smi --query-gpu=name --format=csv,noheader
$B/gpu_kernels --test-threads=1 attention rope_fold wide norm_fold 2>&1 | grep -E "result|FAIL|panick" | tail -5
$B/gpu_model --test-threads=1 activations batched 2>&1 | grep -E "result|FAIL|panick" | tail -5
for v in new base new base; do
  echo "== $v"
  bin=$B/dspark; [ $v = base ] && bin=/tmp/base
  $bin bench --concurrency 1,4,8,16 --concurrency-only --contexts 512 --iters 3 --kv-cache bf16 --activations bf16 2>/dev/null | grep -E '^\| [0-9]+ \| 512'
done
for v in new base; do
  bin=$B/dspark; [ $v = base ] && bin=/tmp/base
  echo "== decode $v"
  $bin bench --no-projections --contexts 512 --iters 8 --kv-cache bf16 --activations bf16 2>/dev/null | grep -E '^\| (decode|verify8|draft_round|round) '
done
