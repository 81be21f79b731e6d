#!/usr/bin/env bash
# A/B of dspark binaries on one GPU in one call (each call may land on a different H200, so only
# runs inside one call compare): alternates the binaries ROUNDS times (default 2) over
# `dspark bench --no-projections` and prints each phase's times. Binaries: AB_BINS (default
# "dspark-base dspark") in AB_DIR (default .gpu-bundle). AB_ENVS runs each binary under each of
# several environment settings (assignments, settings separated by `|`; an empty setting, the
# default, is the plain environment), e.g. AB_ENVS="|DSPARK_ATTN_PF=4" for a knob of an
# experiment patch. Extra arguments go to `dspark bench` (e.g. --contexts 512,4096). On a device
# call ($OUT set) the output is also kept whole in $OUT/ab.txt: a call's reply keeps only the
# last 12,000 characters, which can drop the first round.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    exec > >(tee -a "$OUT/ab.txt") 2>&1
fi
rounds="${ROUNDS:-2}"
bash scripts/unbundle.sh
dir="${AB_DIR:-.gpu-bundle}"
bins="${AB_BINS:-dspark-base dspark}"
# The extra `|` keeps a trailing empty setting ("X|"), which read would drop.
IFS='|' read -r -a envs <<<"${AB_ENVS:-}|"
for r in $(seq "$rounds"); do
    for b in $bins; do
        for e in "${envs[@]}"; do
            echo "== round $r: $b${e:+ ($e)}"
            # shellcheck disable=SC2086
            env $e "$dir/$b" bench --no-projections "$@" | grep -E '^\| (decode|verify8|draft_round|round|round_sampled|round_sampled_t1|round_sampled_law)(_fp8)? '
        done
    done
done
