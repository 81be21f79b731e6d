#!/usr/bin/env bash
# chain.cu built with the engine's matvec and with each named variant of it
# (scripts/exp/chain_patch.py), all alternated ROUNDS times (default 2) at each ATTN of KEYS
# (default "512 4096"; 0 = the matvec chain alone), pdl mode only, NOPDL as chain.cu (default
# 2, the engine's decode policy). Run from the repository root on the GPU:
#   bash scripts/exp/chain_multi.sh wsync wsync2
set -euo pipefail
d=$(mktemp -d)
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/chain.cu -o "$d/chain_base" &
for v in "$@"; do
    python3 scripts/exp/chain_patch.py "$v" "$d/matvec_$v.cu"
    nvcc -arch=sm_90 -O3 -std=c++17 -I kernels -DMATVEC_FILE="\"$d/matvec_$v.cu\"" scripts/exp/chain.cu \
        -o "$d/chain_$v" &
done
wait
for keys in ${KEYS:-512 4096}; do
    for r in $(seq "${ROUNDS:-2}"); do
        for b in base "$@"; do
            echo "== ATTN=$keys round $r: $b"
            ATTN=$keys NOPDL=${NOPDL:-2} "$d/chain_$b" |
                awk '/^M=. pdl/{p=1; print; next} /^M=. (plain|flag)/{p=0} p && /^  (q|o |gate|down|attn|combine|rope)/' |
                sed 's/  output fnv.*//'
        done
    done
done
