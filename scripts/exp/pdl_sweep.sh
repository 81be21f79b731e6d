#!/usr/bin/env bash
# Which kernel boundaries programmatic dependent launch helps: the model phases with every kernel
# on PDL (DSPARK_NO_PDL_FOR empty), then with PDL off for one kernel (a part of its name) at a
# time, then the shipped policy (NO_PDL in crates/dspark-kernels/src/cuda/mod.rs), ROUNDS times
# (default 2). Run from the repository root on the GPU machine after `cargo xtask test --gpu`.
set -euo pipefail
cd "$(dirname "$0")/../.."
export DSPARK_ROOT=$PWD
rounds="${ROUNDS:-2}"
for r in $(seq "$rounds"); do
    for off in "" attention_split attention_tc attention_combine qkv_rope matvec_tc_u4 matvec_tc_bf16 \
        matvec_tc_swiglu argmax default; do
        echo "== round $r: PDL off for '${off}'"
        if [ "$off" = default ]; then
            .gpu-bundle/dspark bench --no-projections --contexts "${CONTEXTS:-512,4096}" --iters 30 2>/dev/null
        else
            DSPARK_NO_PDL_FOR="$off" .gpu-bundle/dspark bench --no-projections --contexts "${CONTEXTS:-512,4096}" \
                --iters 30 2>/dev/null
        fi | grep -E '^\| (decode|verify8|draft_round|round) \|'
    done
done
