#!/usr/bin/env bash
# Every projection with the tensor-core matvec kernels at every K split (`name@ks`: 8 / 4 / 2 / 1,
# so 1 to 8 tiles per block), M = 1 and 7: whether fewer, fuller blocks (which leave room on each
# SM for the next kernel's blocks under PDL) beat the one-wave grid the host picks.
set -euo pipefail
cd "$(dirname "$0")/../.."
export DSPARK_ROOT=$PWD
V=matvec_tc_u4_bf16@8,matvec_tc_u4_bf16@4,matvec_tc_u4_bf16@2,matvec_tc_u4_bf16@1
V=$V,matvec_tc_bf16@8,matvec_tc_bf16@4,matvec_tc_bf16@2,matvec_tc_bf16@1
for r in 1 7; do
    echo "== rows $r"
    .gpu-bundle/dspark bench --projections-only --projection-rows $r --matvec-variants $V 2>/dev/null |
        grep -E '^\| [a-z_]+ \| [0-9]|^- variants'
done
