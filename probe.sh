#!/usr/bin/env bash
# The next device calls for branch x1-packed (branch only; docs/gpu-tier.md). Bundle
# (.gpu-bundle-xz): gpu_kernels, gpu_model, gpu_upload, dspark from x1-packed; dspark-main from main.
#   bash probe.sh tests   # ~4 min: the bf16-rows tests, the wide / norm-fold kernels, the whole gpu_model
#   bash probe.sh ab      # ~5 min: --activations bf16 with bf16 rows, without (DSPARK_NO_BF16_ROWS=1), main
#   bash probe.sh tier    # the whole scripts/gpu-tier.sh (~9 min)
#   bash probe.sh ncu     # ~3 min: where the wide _x1h / _x1 launches' time goes at 32 and 64 rows
set -u
export DSPARK_ROOT=$PWD
bash scripts/unbundle.sh
B=.gpu-bundle
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name --format=csv,noheader
t() { local n=$1 l=$2; shift 2; local s=$SECONDS; timeout $l "$@" > $OUT/$n.log 2>&1; echo "== $n rc=$? $((SECONDS-s))s: $(grep -E '^test result' $OUT/$n.log | tail -1)"; grep -E "FAILED|panicked|^failures:" $OUT/$n.log | head -8; }
for part in "${@:-tests}"; do
case "$part" in
tests)
    t k_rows 200 $B/gpu_kernels --test-threads=1 wide norm_fold matvec
    t model 200 $B/gpu_model --test-threads=1
    ;;
ab)
    for r in 1 2; do for c in "dspark|" "dspark|DSPARK_NO_BF16_ROWS=1" "dspark-main|"; do
        b=${c%%|*}; e=${c#*|}; echo "== $r $b $e"
        timeout 100 env $e $B/$b bench --concurrency 1,4,8,16 --concurrency-only --contexts 512 --iters 6 --kv-cache bf16 --activations bf16 > $OUT/ab-$r-$b-${e%%=*}.md 2>&1
        grep -E "^\| (1|4|8|16) \| 512" $OUT/ab-$r-$b-${e%%=*}.md
        timeout 60 env $e $B/$b bench --no-projections --contexts 512 --iters 10 --activations bf16 2>&1 | grep -E '^\| (decode|verify8|round) '
    done; done
    ;;
ncu)  # 8 requests (budget: 32 rows) and 16 (64 rows), bf16 rows against f32 rows
    for c in "8|" "8|DSPARK_NO_BF16_ROWS=1" "16|" "16|DSPARK_NO_BF16_ROWS=1"; do
        n=${c%%|*}; e=${c#*|}; echo "== $n requests $e"
        timeout 120 env $e bash scripts/stalls.sh 'matvec_tc_(swiglu_|u4_)?x1h?_w[48]' 20 6 -- $B/dspark bench --concurrency $n --concurrency-only --contexts 512 --iters 1 --kv-cache bf16 --activations bf16 2>&1 | cut -c1-1200 | tail -7
    done
    ;;
tier)
    timeout 590 bash scripts/gpu-tier.sh | tail -14
    ;;
esac
done
