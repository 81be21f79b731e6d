#!/usr/bin/env bash
# Second device call for branch gpu-next: the memory plan of branch host-embed and the split
# target of branch tp-cuda (its ranks on this one GPU), neither yet run on a GPU. Its GPU tests (the host table's embedding against the device table's, the FP8 GEMM in
# tiles, whole models on host embeddings and short prefill chunks), then the FP8 Qwen3-8B bench
# at 8k context with the bf16 KV cache, once with the default plan and once with the memory
# levers, in one call so the decode/prefill cost of the levers is an A/B on one host and the
# memory line of each is the issue #29 figure. Needs the bundle (scripts/gpu-next.sh unpacks it).
set -uo pipefail
cd "$(dirname "$0")/.."
export DSPARK_ROOT="$PWD"
out="${OUT:-$PWD/gpu-next-logs}"
mkdir -p "$out" .gpu-bundle
for f in .gpu-bundle-xz/*.xz; do
    b=".gpu-bundle/$(basename "$f" .xz)"
    [ -e "$f" ] && [ ! -x "$b" ] && xz -dc "$f" >"$b" && chmod +x "$b"
done
t() {  # name, limit in seconds, command...
    local name=$1 limit=$2; shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    echo "$name rc=$? $((SECONDS - start))s $(grep -E '^test result:' "$out/$name.log" | tail -1)"
}
t host_kernels 150 .gpu-bundle/gpu_kernels --test-threads=1 host_table fp8_gemm embedding
t memory_plan 150 .gpu-bundle/gpu_model --test-threads=1 memory_plan
t tp_one_gpu 200 .gpu-bundle/gpu_model --test-threads=1 split_targets cuda_drafts_run_on_split
bench=".gpu-bundle/dspark bench --weights fp8 --kv-cache bf16 --contexts 8176 --iters 8 --prefill 4096 --prefill-iters 2 --no-projections"
t bench_mem_default 130 $bench --json "$out/mem_default.json"
t bench_mem_levers 130 $bench --embeddings host --prefill-chunk 256 --json "$out/mem_levers.json"
grep -h -E "device memory|plain_decode|prefill" "$out"/bench_mem_*.log | head -40
