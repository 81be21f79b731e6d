#!/usr/bin/env bash
# o_proj staging its next weight steps in shared memory before its PDL wait (matvec_tc's PRE,
# chain.cu OSM=p) against the engine's o, in the decode layer replica (chain.cu ATTN=keys),
# alternated ROUNDS times (default 2). Each line of VARIANTS is a set of env settings; the
# first is the baseline. Run from the repository root on the GPU: bash scripts/exp/osm.sh
set -euo pipefail
d=$(mktemp -d)
patch -s -p1 -o "$d/matvec_stage.cu" kernels/matvec.cu <scripts/exp/matvec_stage.patch
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels -DCHAIN_STAGE -DMATVEC_FILE="\"$d/matvec_stage.cu\"" scripts/exp/chain.cu -o "$d/chain"
out=${OUT:-$d}
VARIANTS=${VARIANTS:-"OSM=0|OSM=1|OSM=2|OSM=3|OSM=2 CARVE=100|OSM=2 CARVE=100 ACARVE=100"}
for keys in ${KEYS:-512 4096}; do
    for r in $(seq "${ROUNDS:-2}"); do
        IFS='|' read -ra vs <<<"$VARIANTS"
        for v in "${vs[@]}"; do
            f="$out/osm_${keys}_$(echo "$v" | tr ' =' '_-')_r$r.txt"
            env $v ATTN=$keys NOPDL=${NOPDL:-2} "$d/chain" >"$f" 2>&1 || true
            echo "== keys $keys round $r: $v"
            # pdl mode only: the graph line and the o / attention / combine rows after it.
            awk '/^M=. pdl/{p=1; print; next} /^M=. (plain|flag)/{p=0} p && /^  (kernel|o |attn|combine|gate|rope)/' "$f"
        done
    done
done
