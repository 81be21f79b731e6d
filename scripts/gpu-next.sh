#!/usr/bin/env bash
# One device call for branch gpu-next (main + wide-tiles + batched-chain + paged-vmm, none yet
# run on a GPU): the bundle from .gpu-bundle-xz/ (carry it; xz keeps tree + bundle under the
# 64 MiB a call takes), the new GPU tests, then the batched rounds A/B — each branch's switch off
# against all on, and the paged caches against the contiguous ones — in one process per variant.
# The full tier is a second call: `bash scripts/gpu-tier.sh`. Logs and bench JSON go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
export DSPARK_ROOT="$PWD"
out="${OUT:-$PWD/gpu-next-logs}"
mkdir -p "$out" .gpu-bundle
for f in .gpu-bundle-xz/*.xz; do
    [ -e "$f" ] && xz -dc "$f" >".gpu-bundle/$(basename "$f" .xz)" && chmod +x ".gpu-bundle/$(basename "$f" .xz)"
done
t() {  # name, limit in seconds, command...
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    echo "$name rc=$? $((SECONDS - start))s $(grep -E '^test result:' "$out/$name.log" | tail -1)"
}
t wide 120 .gpu-bundle/gpu_kernels --test-threads=1 wide matvec
t batched_paged 240 .gpu-bundle/gpu_model --test-threads=1 batched paged
bench=".gpu-bundle/dspark bench --concurrency 1,4,8,16 --concurrency-only --contexts 512 --iters 6 --kv-cache bf16"
t bench_all 120 $bench --json "$out/all.json"
t bench_no_tiles 120 env DSPARK_NO_WIDE_TILES=1 $bench --json "$out/no_tiles.json"
t bench_no_chain 120 env DSPARK_NO_BATCHED_CHAIN=1 $bench --json "$out/no_chain.json"
t bench_paged 120 $bench --paged --json "$out/paged.json"
grep -h -A12 "Batched rounds" "$out"/bench_*.log | head -80
