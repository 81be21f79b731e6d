#!/usr/bin/env bash
# The next device calls for branches exact-rows, x1-exact and x1-lean (branch only; docs/gpu-tier.md).
# Bundle (.gpu-bundle-xz): gpu_kernels, gpu_model, gpu_upload, dspark from exact-rows;
# gpu_kernels-x1, gpu_model-x1, dspark-x1 from x1-lean; dspark-x1e from x1-exact; dspark-main.
#   bash probe.sh tests   # ~5 min: the new tests and the whole gpu_model of each branch
#   bash probe.sh ab      # ~6 min: what the row-exact slicing / decode and the lean wide loads cost
set -u
export DSPARK_ROOT=$PWD
bash scripts/unbundle.sh
B=.gpu-bundle
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local n=$1 l=$2; shift 2; local s=$SECONDS; timeout $l "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s: $(grep -E '^test result' $OUT/$n.log | tail -1)"; grep -E "FAILED|panicked|^failures:" $OUT/$n.log | head -8; }
case "${1:-tests}" in
tests)
    t k_attn 200 $B/gpu_kernels --test-threads=1 attention rope_fold
    t model 200 $B/gpu_model --test-threads=1
    t x1_kernels 150 $B/gpu_kernels-x1 --test-threads=1 wide matvec a_row_is
    t x1_model 150 $B/gpu_model-x1 --test-threads=1 activations row_exact batched
    ;;
ab)
    for r in 1 2; do for c in "dspark-main|" "dspark|" "dspark|DSPARK_ROW_EXACT=1"; do
        b=${c%%|*}; e=${c#*|}; echo "== $r $b $e"
        timeout 100 env $e $B/$b bench --no-projections --contexts 512,4096 --iters 10 2>&1 | grep -E '^\| (decode|verify8|draft_round|round) '
    done; done
    for c in "dspark-x1e bf16" "dspark-x1 bf16" "dspark-x1 f32"; do set -- $c; echo "== $1 --activations $2"
        timeout 100 $B/$1 bench --concurrency 1,4,8,16 --concurrency-only --contexts 512 --iters 6 --kv-cache bf16 --activations $2 2>&1 | grep -E "^\|" | head -40
    done
    ;;
esac
