#!/usr/bin/env bash
# Install the outputs of a train_coder.py device run (the folder the run tool returns, i.e. what
# the command wrote to $OUT) into the repo:
#   fixtures/coder-target/, fixtures/coder-draft/, fixtures/coder-draft-nomarkov/ (derived),
#   train/heldout_prompts.json, train/outputs/{corpus_manifest.json, corpus_files.sha256,
#   heldout_prompts_with_paths.json, metrics.json, train_log.txt}
#
#   bash train/install_outputs.sh /work/.device/N
set -euo pipefail
SRC="${1:?usage: install_outputs.sh RUN_OUTPUT_DIR}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv-fixtures/bin/python}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

for t in coder-target coder-draft meta; do tar -xf "$SRC/$t.tar" -C "$TMP"; done
for d in coder-target coder-draft; do
  rm -rf "$REPO/fixtures/$d"
  mkdir -p "$REPO/fixtures/$d"
  cp "$TMP/$d/"* "$REPO/fixtures/$d/"
  chmod 644 "$REPO/fixtures/$d/"*
done
"$PY" "$REPO/train/make_nomarkov.py"
chmod 644 "$REPO/fixtures/coder-draft-nomarkov/"*

mkdir -p "$REPO/train/outputs"
cp "$TMP/meta/corpus_manifest.json" "$TMP/meta/corpus_files.sha256" "$REPO/train/outputs/"
cp "$TMP/meta/heldout_prompts.json" "$REPO/train/outputs/heldout_prompts_with_paths.json"
cp "$SRC/metrics.json" "$REPO/train/outputs/metrics.json"
cp "$SRC/log.txt" "$REPO/train/outputs/train_log.txt"
chmod 644 "$REPO/train/outputs/"*
python3 - "$TMP/meta/heldout_prompts.json" "$REPO/train/heldout_prompts.json" <<'EOF'
import json, sys
prompts = [p["prompt"] for p in json.load(open(sys.argv[1]))]
open(sys.argv[2], "w").write(json.dumps(prompts, indent=4) + "\n")
EOF
echo "installed; now: cargo build --release -p dspark-cli && python3 train/measure_acceptance.py"
