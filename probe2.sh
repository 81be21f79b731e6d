#!/usr/bin/env bash
# Short device probe for split-hybrid (branch only).
set -uo pipefail
bash scripts/unbundle.sh
B=.gpu-bundle
xz -dc .gpu-ab/dspark-ws.xz > /tmp/base && chmod +x /tmp/base
nvidia-smi --query-gpu=name --format=csv,noheader
$B/gpu_kernels --test-threads=1 wide 2>&1 | grep -E "result|FAIL|panick"
$B/gpu_model --test-threads=1 activations batched 2>&1 | grep -E "result|FAIL|panick"
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
DSPARK_GPU_SMALL=1 $san --tool memcheck $B/gpu_kernels --test-threads=1 wide 2>&1 | grep -E "ERROR SUMMARY|result" | tail -2
DSPARK_GPU_SMALL=1 $san --tool racecheck $B/gpu_kernels --test-threads=1 wide 2>&1 | grep -E "RACECHECK SUMMARY|result" | tail -2
# new: the hybrid; new32: with the 32-row split twins; base: main's binary, made on main by
# `cargo build --release --bin dspark && xz -T0 -3 -c target/release/dspark > .gpu-ab/dspark-ws.xz`
# (carry .gpu-ab/dspark-ws.xz with .gpu-bundle-xz; DSPARK_NO_SPLIT_WS is a no-op there).
n=0
for v in new new32 base new new32 base; do
  echo "== $v"
  case $v in
    new) bin=$B/dspark; pre="" ;;
    new32) bin=$B/dspark; pre="DSPARK_SPLIT_32=1" ;;
    base) bin=/tmp/base; pre="DSPARK_NO_SPLIT_WS=1" ;;
  esac
  n=$((n+1))
  env $pre $bin bench --concurrency 1,4,8,16 --concurrency-only --contexts 512 --iters 3 --kv-cache bf16 --activations bf16 2>/dev/null > ${OUT:-/tmp}/conc-$v-$n.md
  grep -E '^\| [0-9]+ \| 512' ${OUT:-/tmp}/conc-$v-$n.md
done
for e in "" "DSPARK_NO_SPLIT_CLUSTERS=1"; do
  echo "== proj ${e:-hybrid}"
  env $e $B/dspark bench --projections-only --projection-rows 64 --activations bf16 --iters 5 2>/dev/null | tee ${OUT:-/tmp}/proj-$([ -z "$e" ] && echo hybrid || echo ws).md | grep -E '^\| (q|o|qkv|gate|down)_proj \||^\| (fc|lm_head) \|' | awk -F'|' '{printf "%s %s;", $2, $5} END {print ""}'
done
