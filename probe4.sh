#!/usr/bin/env bash
# Device probe for split32b (branch only): the 32-row split twins and SwiGLU's bf16 act rows.
set -uo pipefail
bash scripts/unbundle.sh
B=.gpu-bundle
O=${OUT:-/tmp}
xz -dc .gpu-ab/dspark-ws.xz > /tmp/base && chmod +x /tmp/base
nvidia-smi --query-gpu=name --format=csv,noheader
$B/gpu_kernels --test-threads=1 wide norm_fold matvec 2>&1 | grep -E "result|FAIL|panick" | tail -5
$B/gpu_model --test-threads=1 activations batched 2>&1 | grep -E "result|FAIL|panick" | tail -5
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
DSPARK_GPU_SMALL=1 $san --tool memcheck $B/gpu_kernels --test-threads=1 wide 2>&1 | grep -E "ERROR SUMMARY|result" | tail -2
n=0
for v in new base new base; do
  echo "== $v"
  bin=$B/dspark; [ $v = base ] && bin=/tmp/base
  n=$((n+1))
  $bin bench --concurrency 1,4,8,16 --concurrency-only --contexts 512 --iters 3 --kv-cache bf16 --activations bf16 2>/dev/null > $O/conc-$v-$n.md
  grep -E '^\| [0-9]+ \| 512' $O/conc-$v-$n.md
done
for v in new base new base; do
  bin=$B/dspark; [ $v = base ] && bin=/tmp/base
  echo "== decode $v"
  $bin bench --no-projections --contexts 512 --iters 10 --kv-cache bf16 --activations bf16 2>/dev/null | grep -E '^\| (decode|verify|draft|round)'
done
