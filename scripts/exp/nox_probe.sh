#!/usr/bin/env bash
# What x costs a matvec: the decode layer replica (ATTN=512) built on matvec_stage.patch and on
# the same with no x loaded (chain_patch.py nox: zeros, wrong results), each with o as the engine
# has it (OSM=0) and with all of o's weights on chip before its wait (OSM=3).
# Run from the repository root on the GPU: bash scripts/exp/nox_probe.sh
set -euo pipefail
d=$(mktemp -d)
python3 scripts/exp/flat_matvec.py "$d/flat.cu"
patch -s -p1 -o "$d/mv.cu" "$d/flat.cu" <scripts/exp/matvec_stage.patch
python3 scripts/exp/chain_patch.py nox "$d/mv_nox.cu" "$d/mv.cu"
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels -DCHAIN_STAGE -DMATVEC_FILE="\"$d/mv.cu\"" scripts/exp/chain.cu -o "$d/chain" &
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels -DCHAIN_STAGE -DMATVEC_FILE="\"$d/mv_nox.cu\"" scripts/exp/chain.cu -o "$d/chain_nox"
wait
for b in chain chain_nox; do
    for o in 0 3; do
        echo "== $b OSM=$o"
        OSM=$o ATTN=512 NOPDL=2 "$d/$b" |
            awk '/^M=. pdl/{p=1; print; next} /^M=. (plain|flag)/{p=0} p && /^  (o |gate|down|q)/' | sed 's/  output fnv.*//'
    done
done
