#!/usr/bin/env bash
# The split-attention experiments of scripts/exp/attn_pf.patch (apply it, `cargo xtask ptx`,
# `cargo xtask test --gpu`, carry .gpu-bundle/): `dspark bench --no-projections` under each
# setting of VARIANTS (environment assignments, settings separated by `|`; an empty setting is
# the shipped behaviour), alternated ROUNDS times (default 2) in one device call. The knobs:
# DSPARK_ATTN_PF (the ATTN_PF_* bits of kernels/common.cuh: L2 prefetch of a slice's cache rows
# before the PDL wait; 1/2 decode kernel, 4/8 tensor-core kernel), DSPARK_TC_PER_SM and
# DSPARK_Q1_PER_SM (blocks per SM the tensor-core / decode kernel's slice plan counts on; 2 and
# 4 shipped: fewer means fewer, longer slices). No setting changes a value:
# each gives the same bits. BIN names the binary in .gpu-bundle/ (default dspark). Extra arguments
# go to `dspark bench` (e.g. --contexts 512,4096).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${ROUNDS:-2}"
bin=".gpu-bundle/${BIN:-dspark}"
variants="${VARIANTS:-|DSPARK_ATTN_PF=1|DSPARK_ATTN_PF=3|DSPARK_ATTN_PF=4|DSPARK_ATTN_PF=12|DSPARK_ATTN_PF=5|DSPARK_ATTN_PF=15|DSPARK_TC_PER_SM=3|DSPARK_TC_PER_SM=3 DSPARK_ATTN_PF=4|DSPARK_Q1_PER_SM=2 DSPARK_ATTN_PF=1}"
IFS='|' read -r -a settings <<<"$variants"
for r in $(seq "$rounds"); do
    for s in "${settings[@]}"; do
        echo "== round $r: ${s:-shipped}"
        # shellcheck disable=SC2086
        env $s "$bin" bench --no-projections "$@" | grep -E '^\| (decode|verify8|draft_round|round) '
    done
done
