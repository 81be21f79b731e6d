#!/usr/bin/env bash
# The experiments queued for the next device call, as one build here and one call there.
# A device call carries the working tree and .gpu-bundle/, 64 MiB in all, and the tracked tree
# is ~28 MB: the tier's bundle (19 MB) and three `dspark` binaries (27 MB) do not fit together.
# So the tier goes first, in its own call, from the bundle of `cargo xtask test --gpu`; then
#   bash scripts/exp/queued.sh build   (here, with Rust: ~2 min on top of that bundle's build)
#     leaves .gpu-bundle/ with `dspark` of this tree and dspark-pf (scripts/exp/attn_pf.patch)
#     and dspark-x1 (scripts/exp/matvec_x1.patch), each built in a scratch worktree with its PTX
#     regenerated; the tier's binaries are removed (27 MB in all);
#   bash scripts/exp/queued.sh run     (on the device, one call of at most ~9.5 min): the two
#     experiments against the shipped kernels, each alternated in the call; logs under $OUT
#     (or ./queued-logs). A part that runs out of its time keeps what it printed.
# What the experiments are and why: docs/perf.md, section "Stop 23".
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
case "${1:-}" in
build)
    cargo build --release -p dspark-cli
    mkdir -p .gpu-bundle
    rm -f .gpu-bundle/gpu_kernels .gpu-bundle/gpu_model .gpu-bundle/dspark-base
    cp target/release/dspark .gpu-bundle/dspark
    strip .gpu-bundle/dspark
    wt=$(mktemp -d)
    git worktree add --detach "$wt" HEAD
    trap 'git -C "$root" worktree remove --force "$wt"' EXIT
    for p in attn_pf matvec_x1; do
        git -C "$wt" checkout -q -- .
        git -C "$wt" apply "$root/scripts/exp/$p.patch"
        [ -d "$root/.venv-nvcc" ] && ln -sfn "$root/.venv-nvcc" "$wt/.venv-nvcc"
        (cd "$wt" && CARGO_TARGET_DIR="$root/target/queued" cargo xtask ptx && CARGO_TARGET_DIR="$root/target/queued" cargo build --release -p dspark-cli)
        cp "$root/target/queued/release/dspark" ".gpu-bundle/dspark-${p##*_}"
        strip ".gpu-bundle/dspark-${p##*_}"
    done
    ls -la .gpu-bundle
    ;;
run)
    out="${OUT:-$PWD/queued-logs}"
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader || true
    # The shipped kernels against x rounded to one bf16 part in the matvecs (what f32-exact x costs).
    ROUNDS=2 AB_BINS="dspark dspark-x1" timeout 150 bash scripts/ab.sh --contexts 512,4096 | tee "$out/x1.txt" || true
    # The attention's L2 prefetch and slice-plan knobs, shipped setting first.
    BIN=dspark-pf VARIANTS="|DSPARK_ATTN_PF=2|DSPARK_ATTN_PF=3|DSPARK_ATTN_PF=4|DSPARK_ATTN_PF=5|DSPARK_ATTN_PF=15|DSPARK_TC_PER_SM=3|DSPARK_Q1_PER_SM=2 DSPARK_ATTN_PF=5" \
        ROUNDS=2 timeout 300 bash scripts/exp/attn_pf.sh --contexts 512,4096 | tee "$out/attn_pf.txt" || true
    BIN=dspark-pf VARIANTS="|DSPARK_ATTN_PF=5|DSPARK_ATTN_PF=15|DSPARK_TC_PER_SM=3" ROUNDS=1 timeout 110 \
        bash scripts/exp/attn_pf.sh --contexts 16384 --iters 15 | tee "$out/attn_pf_16384.txt" || true
    ;;
*)
    echo "usage: bash scripts/exp/queued.sh build|run" >&2
    exit 2
    ;;
esac
