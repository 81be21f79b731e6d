#!/usr/bin/env bash
# The next device call for branch wide-split (branch only): its tests, then A/B against
# DSPARK_NO_WIDE_SPLIT=1 (matvec.cu's wide kernels) in the same binary.
set -u
export DSPARK_ROOT=$PWD
bash scripts/unbundle.sh > /dev/null
B=.gpu-bundle
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local n=$1 l=$2; shift 2; local s=$SECONDS; timeout $l "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s: $(grep -E '^test result' $OUT/$n.log | tail -1)"; grep -E "FAILED|panicked|^failures:" $OUT/$n.log | head -8; }
for part in "${@:-tests}"; do
case "$part" in
tests)
    t k_wide 200 $B/gpu_kernels --test-threads=1 wide
    t model_act 120 $B/gpu_model --test-threads=1 activations batched
    ;;
ab)
    for r in 1 2; do for e in "" "DSPARK_NO_WIDE_SPLIT=1"; do
        echo "== $r ${e:-split}"
        timeout 100 env $e $B/dspark bench --concurrency 1,4,8,16 --concurrency-only --contexts 512 --iters 6 --kv-cache bf16 --activations bf16 > $OUT/ab-$r-${e%%=*}.md 2>&1
        grep -E "^\| (1|4|8|16) \| 512" $OUT/ab-$r-${e%%=*}.md
    done; done
    ;;
proj)
    for rows in ${ROWS:-32 64}; do for e in "" "DSPARK_NO_WIDE_SPLIT=1"; do
        echo "== $rows rows ${e:-split}"
        timeout 100 env $e $B/dspark bench --projections-only --projection-rows $rows --iters 10 --activations bf16 2>&1 | grep -E '^\| (q_proj|k_proj|o_proj|qkv_proj|gate_proj|down_proj|fc|lm_head) '
    done; done
    ;;
esac
done
