#!/usr/bin/env bash
# chain.cu, the decode layer replica, under several environment settings alternated ROUNDS times
# (default 2) at each ATTN of KEYS (default "512 4096"), pdl mode only (NOPDL as chain.cu,
# default 2, the engine's decode policy). VARIANTS is a "|"-separated list of settings; the first
# is the baseline. STAGE=1 builds on matvec_stage.patch (-DCHAIN_STAGE: OSM, CARVE, ACARVE, XS,
# SMEMPAD, XR). Run from the repository root on the GPU, e.g.
#   STAGE=1 VARIANTS="OSM=0|OSM=1|OSM=2|OSM=3|OSM=2 CARVE=100" bash scripts/exp/chain_env.sh
#   STAGE=1 VARIANTS="XS=0|XS=1|SMEMPAD=1|XR=1" KEYS=512 bash scripts/exp/chain_env.sh
#   VARIANTS="GPF=0|GPF=2|GPF=4|GPF=4 GPF_EL=1|GPF=8 GPF_EL=1" bash scripts/exp/chain_env.sh
set -euo pipefail
d=$(mktemp -d)
if [ "${STAGE:-0}" = 1 ]; then
    python3 scripts/exp/flat_matvec.py "$d/flat.cu"
    patch -s -p1 -o "$d/matvec_stage.cu" "$d/flat.cu" <scripts/exp/matvec_stage.patch
    nvcc -arch=sm_90 -O3 -std=c++17 -I kernels -DCHAIN_STAGE -DMATVEC_FILE="\"$d/matvec_stage.cu\"" \
        scripts/exp/chain.cu -o "$d/chain"
else
    nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/chain.cu -o "$d/chain"
fi
IFS='|' read -ra vs <<<"${VARIANTS:?VARIANTS: settings separated by |}"
for keys in ${KEYS:-512 4096}; do
    for r in $(seq "${ROUNDS:-2}"); do
        for v in "${vs[@]}"; do
            echo "== ATTN=$keys round $r: $v"
            env $v ATTN="$keys" NOPDL="${NOPDL:-2}" "$d/chain" |
                awk '/^M=. pdl/{p=1; print; next} /^M=. (plain|flag)/{p=0} p && /^  (kernel|q|o |gate|down|attn|combine|rope)/'
        done
    done
done
