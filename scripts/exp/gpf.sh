#!/usr/bin/env bash
# o asking L2 for the first GPF 256-byte pieces of each row of the layer's gate|up before its
# PDL wait (chain.cu GPF, GPF_EL), in the decode layer replica, variants alternated ROUNDS times
# (default 2). Run from the repository root on the GPU: bash scripts/exp/gpf.sh
set -euo pipefail
d=$(mktemp -d)
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/chain.cu -o "$d/chain"
VARIANTS=${VARIANTS:-"GPF=0|GPF=2|GPF=4|GPF=4 GPF_EL=1|GPF=8 GPF_EL=1"}
for keys in ${KEYS:-512 4096}; do
    for r in $(seq "${ROUNDS:-2}"); do
        IFS='|' read -ra vs <<<"$VARIANTS"
        for v in "${vs[@]}"; do
            echo "== ATTN=$keys round $r: $v"
            env $v ATTN=$keys NOPDL=${NOPDL:-2} "$d/chain" |
                awk '/^M=. pdl/{p=1; print; next} /^M=. (plain|flag)/{p=0} p && /^  (q|o |gate|down|attn|combine)/' |
                sed 's/  output fnv.*//'
        done
    done
done
