#!/usr/bin/env bash
# chain.cu with the engine's matvec and with a variant that requests both register sets of
# weights (two steps) before the PDL wait instead of one, alternated: does a deeper prefetch
# into the previous launch's tail shorten the chain? Run from the repository root on the GPU.
set -euo pipefail
d=$(mktemp -d)
sed -e 's/^    load(a0, b0, kbeg);$/    load(a0, b0, kbeg);\n    if (kbeg + step < kend) load(a1, b1, kbeg + step);/' \
    -e 's/^        load(a1, b1, chunk + step);$/        if (chunk != kbeg) load(a1, b1, chunk + step);/' \
    kernels/matvec.cu > "$d/matvec_pre2.cu"
[ "$(diff kernels/matvec.cu "$d/matvec_pre2.cu" | grep -c '^>')" = 2 ] || { echo "sed did not apply"; exit 1; }
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/chain.cu -o "$d/chain"
nvcc -arch=sm_90 -O3 -std=c++17 -I kernels -DMATVEC_FILE="\"$d/matvec_pre2.cu\"" scripts/exp/chain.cu -o "$d/chain_pre2"
for r in 1 2; do
    for b in chain chain_pre2; do echo "== $b round $r"; "$d/$b" | grep -v '^  kernel'; done
done
