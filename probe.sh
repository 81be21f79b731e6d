#!/usr/bin/env bash
# Device probe for branch split-ws (not for main): `bash probe.sh tests ab proj`.
set -uo pipefail
bash scripts/unbundle.sh
B=.gpu-bundle
nvidia-smi --query-gpu=name --format=csv,noheader
for what in "$@"; do
case $what in
tests)
    $B/gpu_kernels wide 2>&1 | tail -4
    $B/gpu_model activations 2>&1 | tail -4
    ;;
ab)
    for r in ${ROUNDS:-1 2}; do
        IFS='|' read -r -a vs <<<"${VARIANTS:-|DSPARK_NO_SPLIT_WS=1|DSPARK_SPLIT_32=1}"
        for e in "${vs[@]}"; do
            echo "== round $r ${e:-ws}"
            env $e $B/dspark bench --concurrency ${CONC:-1,8,16} --concurrency-only --contexts 512 --iters ${ITERS:-4} --kv-cache bf16 --activations bf16 2>/dev/null | grep -E '^\| [0-9]+ \|'
        done
    done
    ;;
proj)
    for e in "" "DSPARK_NO_SPLIT_WS=1"; do
        echo "== proj ${e:-ws}"
        env $e $B/dspark bench --projections-only --projection-rows 64 --activations bf16 --iters 10 2>/dev/null | grep -E '^\|' | head -30
    done
    ;;
ncu)
    for e in "" "DSPARK_NO_SPLIT_WS=1"; do
        echo "== ncu ${e:-ws}"
        env $e bash scripts/stalls.sh 'matvec_split' ${SKIP:-40} ${COUNT:-14} -- $B/dspark bench --projections-only --projection-rows 64 --activations bf16 --iters 1
    done
    ;;
esac
done
