#!/usr/bin/env bash
# One device call (not committed): exact-rows and x1-exact tests, then the A/B.
set -u
export DSPARK_ROOT=$PWD
bash scripts/unbundle.sh
B=.gpu-bundle
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local n=$1 l=$2; shift 2; local s=$SECONDS; timeout $l "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s: $(grep -E '^test result' $OUT/$n.log | tail -1)"; grep -E "FAILED|panicked|^failures:" $OUT/$n.log | head -8; }
t k_attn 200 $B/gpu_kernels --test-threads=1 attention rope_fold
t model 200 $B/gpu_model --test-threads=1
t x1_model 150 $B/gpu_model-x1 --test-threads=1 activations row_exact
t x1_wide 100 $B/gpu_kernels-x1 --test-threads=1 wide a_row_is
grep -E "DIAG" $OUT/*.log | head
ab() { for r in 1 2; do for c in "dspark-main|" "dspark|" "dspark|DSPARK_ROW_EXACT=1"; do b=${c%%|*}; e=${c#*|}; echo "== $r $b $e"; env $e $B/$b bench --no-projections "$@" 2>&1 | grep -E '^\| (decode|verify8|draft_round|round) '; done; done; }
s=$SECONDS; timeout 240 bash -c "$(declare -f ab); B=$B; ab --contexts 512,4096 --iters 10" 2>&1 | tee $OUT/ab.log; echo "ab $((SECONDS-s))s"
s=$SECONDS; for a in f32 bf16; do timeout 100 $B/dspark-x1 bench --concurrency 1,4,8,16 --concurrency-only --contexts 512 --iters 6 --kv-cache bf16 --activations $a > $OUT/conc-$a.log 2>&1; echo "conc $a rc=$?"; grep -E "^\|" $OUT/conc-$a.log | head -30; done; echo "conc $((SECONDS-s))s"
