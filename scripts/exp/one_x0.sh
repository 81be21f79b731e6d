#!/usr/bin/env bash
# The one-row twins of matvec_one.patch (chain.cu -DCHAIN_ONE, ONE=1) against M = 1 on the
# several-row kernels (ONE=0) and against the twins with x loaded by lane group 0 only
# (chain_patch.py one_x0, a cost probe), in the decode layer replica at 512 keys, two rounds.
# Run from the repository root on the GPU: bash scripts/exp/one_x0.sh
set -euo pipefail
d=$(mktemp -d)
python3 scripts/exp/flat_matvec.py "$d/flat.cu"
patch -s -p1 -o "$d/one.cu" "$d/flat.cu" <scripts/exp/matvec_one.patch
python3 scripts/exp/chain_patch.py one_x0 "$d/ox.cu" "$d/one.cu"
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels -DCHAIN_ONE -DMATVEC_FILE="\"$d/one.cu\"" scripts/exp/chain.cu -o $d/chain &
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels -DCHAIN_ONE -DMATVEC_FILE="\"$d/ox.cu\"" scripts/exp/chain.cu -o $d/chain_ox
wait
for r in 1 2; do for v in "chain ONE=0" "chain ONE=1" "chain_ox ONE=1"; do set -- $v; echo "== $v"; env $2 ATTN=512 NOPDL=2 $d/$1 | awk '/^M=1 pdl/{p=1; print; next} /^M=. (plain|flag)|^M=8/{p=0} p && /^  (q|o |gate|down)/' | sed 's/  output fnv.*//'; done; done
