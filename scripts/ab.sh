#!/usr/bin/env bash
# A/B of dspark binaries on one GPU in one call (each call may land on a different H200, so only
# runs inside one call compare): alternates the binaries ROUNDS times (default 2) over
# `dspark bench --no-projections` and prints each phase's times. Binaries: AB_BINS (default
# "dspark-base dspark") in AB_DIR (default .gpu-bundle). Extra arguments go to `dspark bench`
# (e.g. --contexts 512,4096).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${ROUNDS:-2}"
dir="${AB_DIR:-.gpu-bundle}"
bins="${AB_BINS:-dspark-base dspark}"
for r in $(seq "$rounds"); do
    for b in $bins; do
        echo "== round $r: $b"
        "$dir/$b" bench --no-projections "$@" | grep -E '^\| (decode|verify8|draft_round|round) '
    done
done
