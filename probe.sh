#!/usr/bin/env bash
# The next device calls for branches exact-rows, x1-exact and x1-lean (branch only; docs/gpu-tier.md).
# Bundle (.gpu-bundle-xz): gpu_kernels, gpu_model, gpu_upload, dspark from exact-rows;
# gpu_kernels-x1, gpu_model-x1, dspark-x1 from x1-lean; dspark-x1e from x1-exact; dspark-main.
#   bash probe.sh tests   # ~5 min: the new tests and the whole gpu_model of each branch
#   bash probe.sh ab      # ~6 min: what the row-exact slicing / decode and the lean wide loads cost
#   bash probe.sh ab1 / abx  # the row-exact A/B's first round; the x1 modes' concurrency rows
#   bash probe.sh san     # ~3 min: memcheck / racecheck of the changed kernels
#   bash probe.sh ncu     # ~3 min: ncu of the x1 wide matvecs at 8 / 32 / 64 rows
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
    t k_attn 200 $B/gpu_kernels --test-threads=1 attention rope_fold
    t model 200 $B/gpu_model --test-threads=1
    t x1_kernels 150 $B/gpu_kernels-x1 --test-threads=1 wide matvec a_row_is
    t x1_model 150 $B/gpu_model-x1 --test-threads=1 activations row_exact batched
    ;;
quick)  # ~3 min: the row-bits kernel test and the x1 mode's model tests alone
    t k_rows 120 $B/gpu_kernels --test-threads=1 a_row_is
    t x1_model 150 $B/gpu_model-x1 --test-threads=1 activations row_exact batched
    ;;
san)  # the sanitizers on what exact-rows changed (small shapes), ~3 min
    export DSPARK_GPU_SMALL=1
    c="compute-sanitizer --error-exitcode 9"
    t mem_attn 100 $c --tool memcheck $B/gpu_kernels --test-threads=1 attention
    t race_attn 100 $c --tool racecheck $B/gpu_kernels --test-threads=1 attention
    t mem_model 120 $c --tool memcheck $B/gpu_model --test-threads=1 row_exact batched paged
    t mem_x1 80 $c --tool memcheck $B/gpu_kernels-x1 --test-threads=1 wide
    for n in mem_attn race_attn mem_model mem_x1; do grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$n.log | tail -1; done
    ;;
ncu)  # where the x1 wide matvecs' time goes at 8 / 32 / 64 rows (L1 hits, L2 and DRAM throughput, stalls)
    for r in 8 32 64; do echo "== rows $r"
        timeout 100 bash scripts/stalls.sh 'matvec_tc' 0 6 -- $B/dspark-x1 bench --projections-only --projection-rows $r --iters 1 --activations bf16 2>&1 | cut -c1-900 | head -8
        timeout 60 ncu --clock-control none --launch-count 4 -k regex:matvec_tc --metrics gpu__time_duration.sum,l1tex__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum --csv --page raw $B/dspark-x1 bench --projections-only --projection-rows $r --iters 1 --activations bf16 2>/dev/null | grep -E '^"(ID|[0-9])' | cut -c1-600
    done
    ;;
ab|ab1)  # ab1: one round of the row-exact A/B (~2 min); ab: two rounds, then abx
    [ "$part" = ab1 ] && rounds=1 || rounds="1 2"
    for r in $rounds; do for c in "dspark-main|" "dspark|" "dspark|DSPARK_ROW_EXACT=1"; do
        b=${c%%|*}; e=${c#*|}; echo "== $r $b $e"
        timeout 100 env $e $B/$b bench --no-projections --contexts 512,4096 --iters 10 2>&1 | grep -E '^\| (decode|verify8|draft_round|round) '
    done; done
    [ "$part" = ab1 ] && continue
    ;&
abx)  # the x1 modes' concurrency rows (~2 min)
    for c in "dspark-x1e bf16" "dspark-x1 bf16" "dspark-x1 f32"; do set -- $c; echo "== $1 --activations $2"
        timeout 100 $B/$1 bench --concurrency 1,4,8,16 --concurrency-only --contexts 512 --iters 6 --kv-cache bf16 --activations $2 > $OUT/abx-$1-$2.md 2>&1
        # The concurrency table and goals; the kernel profiles stay in the file.
        grep -E "^\|" $OUT/abx-$1-$2.md | grep -v -E "^\| (matvec|attention|rmsnorm|rope|argmax|markov|embedding|split|sample|copy|kernel)" | head -30
    done
    ;;
esac
done
