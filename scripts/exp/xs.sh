#!/usr/bin/env bash
# At M = 1, x staged in shared memory (matvec_tc's XS, chain.cu XS=1) or kept for later steps in
# the idle lanes (XR, chain.cu XR=1), against the engine's per-step x loads, in the decode layer
# replica, alternated ROUNDS times (default 3). Run from the repository root on the GPU:
#   KNOB=XR bash scripts/exp/xs.sh, or VARIANTS="XS=0 XS=1 SMEMPAD=1" bash scripts/exp/xs.sh
set -euo pipefail
d=$(mktemp -d)
patch -s -p1 -o "$d/matvec_stage.cu" kernels/matvec.cu <scripts/exp/matvec_stage.patch
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels -DCHAIN_STAGE -DMATVEC_FILE="\"$d/matvec_stage.cu\"" scripts/exp/chain.cu -o "$d/chain"
for keys in ${KEYS:-512 4096}; do
    for r in $(seq "${ROUNDS:-3}"); do
        for v in ${VARIANTS:-XS=0 ${KNOB:-XS}=1}; do
            echo "== ATTN=$keys round $r: $v"
            env $v ATTN=$keys NOPDL=${NOPDL:-2} "$d/chain" |
                awk '/^M=1 pdl/{p=1; print; next} /^M=. (plain|flag)|^M=8/{p=0} p && /^  (q|o |gate|down)/'
        done
    done
done
