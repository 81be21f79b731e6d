#!/usr/bin/env bash
# A/B of dspark binaries on one GPU in one call (each call may land on a different H200, so only
# runs inside one call compare): alternates the binaries ROUNDS times (default 2) over
# `dspark bench --no-projections` and prints each phase's times. Binaries: AB_BINS (default
# "dspark-base dspark") in AB_DIR (default .gpu-bundle). AB_ENVS runs each binary under each of
# several environment settings (assignments, settings separated by `|`; an empty setting, the
# default, is the plain environment), e.g. AB_ENVS="|DSPARK_ATTN_PF=4" for a knob of an
# experiment patch. Extra arguments go to `dspark bench` (e.g. --contexts 512,4096). On a device
# call ($OUT set) the output is also kept whole in $OUT/ab.txt: a call's reply keeps only the
# last 12,000 characters, which can drop the first round. A summary at the end gives each phase's
# times per binary and setting, and the change of their mean against the first one's.
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
runs=$(mktemp)
trap 'rm -f "$runs"' EXIT  # also when a bench fails and set -e ends the script
for r in $(seq "$rounds"); do
    for b in $bins; do
        for e in "${envs[@]}"; do
            echo "== round $r: $b${e:+ ($e)}"
            # shellcheck disable=SC2086
            out=$(env $e "$dir/$b" bench --no-projections "$@" |
                grep -E '^\| (decode|verify8|draft_round|round|round_sampled|round_sampled_t1|round_sampled_law)(_fp8)? ')
            echo "$out"
            awk -v l="$b${e:+ ($e)}" '{ print l "\t" $0 }' <<<"$out" >>"$runs"
        done
    done
done
# Each phase's times over the rounds, per binary and setting, and the change of their mean
# against the first one's.
echo "== summary: µs in each round; change of the mean against the first"
awk -F'\t' '{
    split($2, c, "|"); gsub(/ /, "", c[2]); gsub(/ /, "", c[3]); gsub(/ /, "", c[4])
    k = c[2] " " c[3]; if (!(k in seen)) { seen[k] = 1; keys[++nk] = k }
    if (!($1 in seenv)) { seenv[$1] = 1; vs[++nv] = $1 }
    t[k, $1] = t[k, $1] (t[k, $1] == "" ? "" : " / ") c[4]; s[k, $1] += c[4]; n[k, $1]++
} END {
    for (i = 1; i <= nk; i++) {
        k = keys[i]; line = sprintf("%-24s", k); base = s[k, vs[1]] / n[k, vs[1]]
        for (j = 1; j <= nv; j++) {
            v = vs[j]; if (!n[k, v]) continue
            line = line sprintf(" | %s: %s", v, t[k, v])
            if (j > 1) line = line sprintf(" (%+.2f%%)", 100 * (s[k, v] / n[k, v] / base - 1))
        }
        print line
    }
}' "$runs"
