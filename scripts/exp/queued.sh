#!/usr/bin/env bash
# The experiment queued for a device call (attn_pf.patch), as one build here and one call there.
# A device call carries the working tree and .gpu-bundle/, 64 MiB in all; the tracked tree is
# ~30 MB and a stripped `dspark` ~27 MB (12 MB with xz), so the binaries travel compressed:
#   bash scripts/exp/queued.sh build   (here, with Rust: a few minutes)
#     leaves .gpu-bundle/ with dspark.xz of this tree and dspark-pf.xz (scripts/exp/attn_pf.patch,
#     built in a scratch worktree with its PTX regenerated); the tier's binaries are removed;
#   bash scripts/exp/queued.sh run     (on the device, ~7 min): attn_pf.patch's knobs
#     (DSPARK_ATTN_PF: the ATTN_PF_* bits of its kernels/common.cuh, L2 prefetch of a slice's
#     cache rows before the PDL wait, 1/2 decode kernel, 4/8 tensor-core kernel;
#     DSPARK_TC_PER_SM / DSPARK_Q1_PER_SM: blocks per SM the slice plans count on, 2 and 4
#     shipped) by scripts/ab.sh's AB_ENVS, at 512 / 4096 keys and at 16384. No setting changes
#     a value.
# Logs under $OUT (or ./queued-logs); a part that runs out of its time keeps what it printed.
# What the experiment is and why: docs/perf.md, section "Prepared experiments, not yet measured".
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
case "${1:-}" in
build)
    cargo build --release -p dspark-cli
    rm -rf .gpu-bundle
    mkdir -p .gpu-bundle
    cp target/release/dspark .gpu-bundle/dspark
    strip .gpu-bundle/dspark
    wt=$(mktemp -d)
    git worktree add --detach "$wt" HEAD
    trap 'git -C "$root" worktree remove --force "$wt"' EXIT
    git -C "$wt" apply "$root/scripts/exp/attn_pf.patch"
    [ -d "$root/.venv-nvcc" ] && ln -sfn "$root/.venv-nvcc" "$wt/.venv-nvcc"
    (cd "$wt" && CARGO_TARGET_DIR="$root/target/queued" cargo xtask ptx && CARGO_TARGET_DIR="$root/target/queued" cargo build --release -p dspark-cli)
    cp "$root/target/queued/release/dspark" .gpu-bundle/dspark-pf
    strip .gpu-bundle/dspark-pf
    xz -T2 -9 -f .gpu-bundle/dspark .gpu-bundle/dspark-pf
    ls -la .gpu-bundle
    ;;
run)
    out="${OUT:-$PWD/queued-logs}"
    mkdir -p "$out"
    (cd .gpu-bundle && for f in *.xz; do xz -d -f "$f"; done && chmod +x dspark*)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader || true
    # The attention's L2 prefetch and slice-plan knobs, shipped setting first.
    AB_BINS=dspark-pf AB_ENVS="|DSPARK_ATTN_PF=2|DSPARK_ATTN_PF=3|DSPARK_ATTN_PF=4|DSPARK_ATTN_PF=5|DSPARK_ATTN_PF=15|DSPARK_TC_PER_SM=3|DSPARK_Q1_PER_SM=2 DSPARK_ATTN_PF=5" \
        ROUNDS=2 timeout 330 bash scripts/ab.sh --contexts 512,4096 --prefill 512 --prefill-iters 1 | tee "$out/attn_pf.txt" || true
    AB_BINS=dspark-pf AB_ENVS="|DSPARK_ATTN_PF=5|DSPARK_ATTN_PF=15|DSPARK_TC_PER_SM=3" ROUNDS=1 timeout 150 \
        bash scripts/ab.sh --contexts 16384 --iters 15 --prefill 512 --prefill-iters 1 | tee "$out/attn_pf_16384.txt" || true
    ;;
*)
    echo "usage: bash scripts/exp/queued.sh build|run" >&2
    exit 2
    ;;
esac
