#!/usr/bin/env bash
# Device probe for split32 (branch only): tests, A/B against main's binary, the 8-request
# profile, and ncu of the model's kernels at 8 requests.
set -uo pipefail
bash scripts/unbundle.sh
B=.gpu-bundle
O=${OUT:-/tmp}
xz -dc .gpu-ab/dspark-ws.xz > /tmp/base && chmod +x /tmp/base
nvidia-smi --query-gpu=name --format=csv,noheader
$B/gpu_kernels --test-threads=1 wide 2>&1 | grep -E "result|FAIL|panick"
$B/gpu_model --test-threads=1 activations batched 2>&1 | grep -E "result|FAIL|panick"
n=0
for v in new wave base new wave base; do
  echo "== $v"
  case $v in
    new) bin=$B/dspark; pre="" ;;
    wave) bin=$B/dspark; pre="DSPARK_SPLIT_WAVE_RULE=1" ;;
    base) bin=/tmp/base; pre="" ;;
  esac
  n=$((n+1))
  env $pre $bin bench --concurrency 1,4,8,16 --concurrency-only --contexts 512 --iters 3 --kv-cache bf16 --activations bf16 2>/dev/null > $O/conc-$v-$n.md
  grep -E '^\| [0-9]+ \| 512' $O/conc-$v-$n.md
done
for v in new base; do
  bin=$B/dspark; [ $v = base ] && bin=/tmp/base
  $bin bench --concurrency 8 --concurrency-only --contexts 512 --iters 3 --kv-cache bf16 --activations bf16 2>/dev/null > $O/conc8-$v.md
done
timeout 240 bash scripts/stalls.sh '.' 4000 400 -- $B/dspark bench --concurrency 8 --concurrency-only --contexts 512 --iters 1 --kv-cache bf16 --activations bf16 > $O/ncu8.csv
wc -l $O/ncu8.csv
