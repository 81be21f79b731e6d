#!/usr/bin/env bash
# `dspark serve` against `dspark generate` on the GPU machine: the same model, prompt and length,
# greedy. Runs `generate --json`, then `serve` on a free port (waiting for /health 200), one
# warm-up and RUNS streamed /v1/completions requests through a standard-library client, and reads
# each process's GPU memory with nvidia-smi. Prints one line of JSON: tok/s streamed by the server
# over generate's decode tok/s (ratio_tokens_per_second), the server's first streamed token minus
# generate's prefill (first_token_minus_prefill_ms), both GPU memories, and whether the server's
# tokens equal generate's (they must, at temperature 0). Logs and summary.json under $OUT.
#
# Usage: DSPARK=.gpu-bundle/dspark TARGET=/path/to/qwen3 [DRAFT=/path/to/draft] \
#            [PROMPT_TOKENS=512 | PROMPT='text'] [N=256] [RUNS=3] [DEVICE=cuda] \
#            [CLIENTS=8 MAX_BATCH=8] bash scripts/serve-bench.sh
# CLIENTS > 1 adds a load phase: that many streaming clients at once, RUNS requests each, against
# a server of `--max-batch MAX_BATCH` (aggregate tok/s, first-token and inter-token p50 / p99).
# Without TARGET it serves the embedded demo pair. A TARGET without tokenizer.json (the random
# Qwen3-8B of scripts/random_qwen3.py, as scripts/ttft.sh makes it: TARGET=/tmp/qwen3-8b-random)
# gets the real Qwen3 tokenizer copied in from TOKENIZER (default .test-data/qwen3/tokenizer.json,
# fetched by `cargo xtask fetch-test-data`): serving needs one, and the prompt is token ids anyway.
set -euo pipefail
cd "$(dirname "$0")/.."
export DSPARK="${DSPARK:-$PWD/.gpu-bundle/dspark}"
export OUT="${OUT:-$PWD/serve-bench-logs}"
[ -x "$DSPARK" ] || { echo "serve-bench: no dspark binary at $DSPARK (cargo xtask test --gpu builds .gpu-bundle/dspark)" >&2; exit 1; }
command -v nvidia-smi > /dev/null || echo "serve-bench: no nvidia-smi: GPU memory reads as 0" >&2
if [ -n "${TARGET:-}" ] && [ ! -f "$TARGET/tokenizer.json" ]; then
    tok="${TOKENIZER:-$PWD/.test-data/qwen3/tokenizer.json}"
    [ -f "$tok" ] || { echo "serve-bench: $TARGET has no tokenizer.json and there is none at $tok (set TOKENIZER)" >&2; exit 1; }
    echo "serve-bench: copying $tok into $TARGET (serving needs a tokenizer)" >&2
    cp "$tok" "$TARGET/tokenizer.json"
fi
mkdir -p "$OUT"
python3 scripts/serve_bench.py | tee "$OUT/summary.line.json"
