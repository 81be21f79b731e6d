#!/usr/bin/env bash
# Device probe for branch split-lean (not for main): `bash probe.sh tests ab proj ncu`.
# The baseline is main's split kernels: split-ws's binary (.gpu-ab/dspark-ws.xz) under
# DSPARK_NO_SPLIT_WS=1.
set -uo pipefail
bash scripts/unbundle.sh
B=.gpu-bundle
for b in ws; do [ -x .gpu-ab/dspark-$b ] || { xz -dc .gpu-ab/dspark-$b.xz > .gpu-ab/dspark-$b && chmod +x .gpu-ab/dspark-$b; }; done
nvidia-smi --query-gpu=name --format=csv,noheader
run_as() {  # name → command prefix
    case $1 in
        new) echo "$B/dspark" ;;
        base) echo "env DSPARK_NO_SPLIT_WS=1 .gpu-ab/dspark-ws" ;;
        nosplit) echo "env DSPARK_NO_WIDE_SPLIT=1 $B/dspark" ;;
        lean) echo ".gpu-ab/dspark-probe" ;;
        nocl) echo "env DSPARK_NO_SPLIT_CLUSTERS=1 $B/dspark" ;;
    esac
}
for what in "$@"; do
case $what in
tests)
    $B/gpu_kernels --test-threads=1 wide matvec norm_fold 2>&1 | grep -E "^test |result"
    $B/gpu_model --test-threads=1 activations batched 2>&1 | grep -E "^test |result"
    ;;
san)
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    DSPARK_GPU_SMALL=1 $san --tool memcheck $B/gpu_kernels --test-threads=1 wide 2>&1 | grep -E "ERROR SUMMARY|result" | tail -2
    DSPARK_GPU_SMALL=1 $san --tool racecheck $B/gpu_kernels --test-threads=1 wide 2>&1 | grep -E "RACECHECK SUMMARY|ERROR SUMMARY|result|hazard" | tail -3
    DSPARK_GPU_SMALL=1 $san --tool memcheck $B/gpu_model --test-threads=1 activations 2>&1 | grep -E "ERROR SUMMARY|result" | tail -2
    ;;
ab)
    for r in ${ROUNDS:-1 2}; do
        for v in ${VARIANTS:-new base}; do
            echo "== round $r $v"
            $(run_as $v) bench --concurrency ${CONC:-1,8,16} --concurrency-only --contexts 512 --iters ${ITERS:-4} --kv-cache bf16 --activations bf16 2>/dev/null | grep -E '^\| [0-9]+ \| 512'
        done
    done
    ;;
proj)
    for v in ${VARIANTS:-new base}; do
        echo "== proj $v"
        $(run_as $v) bench --projections-only --projection-rows ${PROWS:-64} --activations bf16 --iters 10 2>/dev/null | grep -E '^\| [a-z_]+ \| [0-9]+ ×'
    done
    ;;
ncu)
    for v in ${VARIANTS:-new base}; do
        echo "== ncu $v"
        if [ $v = base ]; then pre="env DSPARK_NO_SPLIT_WS=1"; bin=.gpu-ab/dspark-ws; else pre=""; bin=$B/dspark; fi
        $pre bash scripts/stalls.sh 'matvec_split' ${SKIP:-40} ${COUNT:-6} -- $bin bench --projections-only --projection-rows 64 --activations bf16 --iters 1
    done
    ;;
esac
done
