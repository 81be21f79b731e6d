#!/usr/bin/env bash
# chain.cu built with the engine's matvec and with a variant of it (scripts/exp/chain_patch.py
# VARIANT), the two alternated ROUNDS times (default 2). Run from the repository root on the
# GPU: bash scripts/exp/chain_ab.sh rot
set -euo pipefail
variant="$1"
d=$(mktemp -d)
python3 scripts/exp/chain_patch.py "$variant" "$d/matvec_$variant.cu"
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/chain.cu -o "$d/chain"
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels -DMATVEC_FILE="\"$d/matvec_$variant.cu\"" scripts/exp/chain.cu \
    -o "$d/chain_$variant"
for r in $(seq "${ROUNDS:-2}"); do
    for b in chain "chain_$variant"; do echo "== $b round $r"; "$d/$b" | grep -v '^  kernel'; done
done
