#!/usr/bin/env bash
# Time to first token as a user meets it, on the GPU machine: writes a random Qwen3-8B
# checkpoint in the Hub's layout (bf16 shards + index, Hub config.json; scripts/random_qwen3.py,
# torch + safetensors), then times `dspark generate` on it — load (hot page cache), prefill of a
# PROMPT-token prompt, decode — and the same prompt through transformers' bf16 forward (sdpa),
# the peer, in the same call. Needs .gpu-bundle/dspark (`cargo xtask test --gpu`).
# Usage: bash scripts/ttft.sh [PROMPT=4000]; logs under $OUT (or ./ttft-logs). EXACT=1 also runs
# --prefill exact; PEER=0 skips transformers; COLD=1 then drops the shards from the page cache
# (posix_fadvise DONTNEED after sync) and loads again, and times a plain read of the cold files.
# FP8=1 writes and times Qwen's block-scaled FP8 layout instead (set PEER=0: the peer is bf16).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-$PWD/ttft-logs}"
mkdir -p "$out"
prompt=${1:-4000}
dir=${CKPT:-/tmp/qwen3-8b-random$([ "${FP8:-0}" = 1 ] && echo -fp8)}
[ -f "$dir/model.safetensors.index.json" ] || python3 scripts/random_qwen3.py "$dir"
ids=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(151643)) for _ in range($prompt)))")
# Warm the page cache, as a second run of the same model would find it.
cat "$dir"/*.safetensors > /dev/null
for mode in gemm exact; do
    [ "$mode" = exact ] && [ "${EXACT:-0}" = 0 ] && continue
    .gpu-bundle/dspark generate --target "$dir" --prompt-ids "$ids" --max-tokens 64 --max-context $((prompt + 128)) \
        --prefill "$mode" --json > "$out/dspark-$mode.json" 2> "$out/dspark-$mode.err" || { cat "$out/dspark-$mode.err"; exit 1; }
    python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stats']; print('dspark', sys.argv[2], {k: v for k, v in s.items() if k.endswith('_ms') or k.endswith('per_s')})" "$out/dspark-$mode.json" "$mode"
done
if [ "${PEER:-1}" = 1 ]; then
python3 - "$dir" "$prompt" <<'PY' | tee "$out/transformers.txt"
import sys, time, torch
from transformers import AutoModelForCausalLM
d, n = sys.argv[1], int(sys.argv[2])
t = time.time()
m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
torch.cuda.synchronize()
load = time.time() - t
ids = torch.randint(0, 151643, (1, n), device="cuda")
with torch.no_grad():
    for i in range(4):
        torch.cuda.synchronize(); t = time.time()
        m(ids, use_cache=True, logits_to_keep=1)
        torch.cuda.synchronize()
        if i: print(f"transformers bf16 sdpa prefill of {n}: {1e3 * (time.time() - t):.1f} ms")
print(f"transformers from_pretrained bf16 + .cuda(): {load:.1f} s")
PY
fi
if [ "${COLD:-0}" = 1 ]; then
    drop() { sync; python3 -c "import glob, os, sys
for f in glob.glob(sys.argv[1] + '/*.safetensors'):
    fd = os.open(f, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)" "$dir"; }
    drop
    .gpu-bundle/dspark generate --target "$dir" --prompt-ids "$ids" --max-tokens 8 --max-context $((prompt + 128)) \
        --json > "$out/dspark-cold.json" 2> "$out/dspark-cold.err" || { cat "$out/dspark-cold.err"; exit 1; }
    python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['stats']; print('dspark cold cache: load_ms', s['load_ms'])" "$out/dspark-cold.json"
    drop
    start=$(date +%s.%N); cat "$dir"/*.safetensors > /dev/null; end=$(date +%s.%N)
    python3 -c "import sys, glob, os; b = sum(os.path.getsize(f) for f in glob.glob(sys.argv[1] + '/*.safetensors')); t = float(sys.argv[3]) - float(sys.argv[2]); print(f'cold read of the shards: {b / 1e9:.1f} GB in {t:.2f} s = {b / t / 1e9:.2f} GB/s')" "$dir" "$start" "$end"
fi
