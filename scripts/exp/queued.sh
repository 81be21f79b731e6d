#!/usr/bin/env bash
# The experiments queued for the next device call, as one build here and two calls there.
# A device call carries the working tree and .gpu-bundle/, 64 MiB in all, and the tracked tree
# is ~28 MB: the tier's bundle (19 MB) does not fit beside four `dspark` binaries (36 MB). So
# the tier goes first, in its own call, from the bundle of `cargo xtask test --gpu`; then
#   bash scripts/exp/queued.sh build   (here, with Rust: a few minutes on top of that build)
#     leaves .gpu-bundle/ with `dspark` of this tree and dspark-pf (scripts/exp/attn_pf.patch),
#     dspark-x1 (matvec_x1.patch) and dspark-merge (attn_merge.patch), each built in a scratch
#     worktree with its PTX regenerated, and merge-src/ (that worktree's kernels/ and fold.cu,
#     for the kernel harness); the tier's binaries are removed;
#   bash scripts/exp/queued.sh run1    (on the device, ~4 min): matvec_x1 and attn_merge against
#     the shipped kernels (ab.sh), and fold.cu on the merged kernel (times, and its output
#     checked bit for bit against append + attention + combine);
#   bash scripts/exp/queued.sh run2    (on the device, ~7 min): attn_pf.patch's knobs
#     (DSPARK_ATTN_PF: the ATTN_PF_* bits of its kernels/common.cuh, L2 prefetch of a slice's
#     cache rows before the PDL wait, 1/2 decode kernel, 4/8 tensor-core kernel;
#     DSPARK_TC_PER_SM / DSPARK_Q1_PER_SM: blocks per SM the slice plans count on, 2 and 4
#     shipped) by scripts/ab.sh's AB_ENVS, at 512 / 4096 keys and at 16384. No setting changes
#     a value.
# Logs under $OUT (or ./queued-logs); a part that runs out of its time keeps what it printed.
# What the experiments are and why: docs/perf.md, section "Prepared experiments, not yet measured".
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
    for p in attn_pf matvec_x1 attn_merge; do
        git -C "$wt" checkout -q -- .
        git -C "$wt" apply "$root/scripts/exp/$p.patch"
        [ -d "$root/.venv-nvcc" ] && ln -sfn "$root/.venv-nvcc" "$wt/.venv-nvcc"
        (cd "$wt" && CARGO_TARGET_DIR="$root/target/queued" cargo xtask ptx && CARGO_TARGET_DIR="$root/target/queued" cargo build --release -p dspark-cli)
        cp "$root/target/queued/release/dspark" ".gpu-bundle/dspark-${p##*_}"
        strip ".gpu-bundle/dspark-${p##*_}"
        if [ "$p" = attn_merge ]; then
            rm -rf .gpu-bundle/merge-src
            mkdir -p .gpu-bundle/merge-src
            cp -r "$wt/kernels" "$wt/scripts/exp/fold.cu" .gpu-bundle/merge-src/
        fi
    done
    ls -la .gpu-bundle
    ;;
run1)
    out="${OUT:-$PWD/queued-logs}"
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader || true
    # The decode attention's combine merged in its launch: the kernels alone (and bit for bit).
    nvcc -arch=sm_90 -O3 -std=c++17 -I .gpu-bundle/merge-src/kernels .gpu-bundle/merge-src/fold.cu -o /tmp/fold-merge &&
        for ctx in 512 4096 16384; do timeout 30 /tmp/fold-merge q1 "$ctx"; done | tee "$out/fold_merge.txt" || true
    # The shipped kernels against x rounded to one bf16 part in the matvecs (what f32-exact x
    # costs) and against the merged decode attention.
    ROUNDS=2 AB_BINS="dspark dspark-x1 dspark-merge" timeout 200 bash scripts/ab.sh --contexts 512,4096 | tee "$out/x1_merge.txt" || true
    ;;
run2)
    out="${OUT:-$PWD/queued-logs}"
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader || true
    # The attention's L2 prefetch and slice-plan knobs, shipped setting first.
    AB_BINS=dspark-pf AB_ENVS="|DSPARK_ATTN_PF=2|DSPARK_ATTN_PF=3|DSPARK_ATTN_PF=4|DSPARK_ATTN_PF=5|DSPARK_ATTN_PF=15|DSPARK_TC_PER_SM=3|DSPARK_Q1_PER_SM=2 DSPARK_ATTN_PF=5" \
        ROUNDS=2 timeout 330 bash scripts/ab.sh --contexts 512,4096 | tee "$out/attn_pf.txt" || true
    AB_BINS=dspark-pf AB_ENVS="|DSPARK_ATTN_PF=5|DSPARK_ATTN_PF=15|DSPARK_TC_PER_SM=3" ROUNDS=1 timeout 150 \
        bash scripts/ab.sh --contexts 16384 --iters 15 | tee "$out/attn_pf_16384.txt" || true
    ;;
*)
    echo "usage: bash scripts/exp/queued.sh build|run1|run2" >&2
    exit 2
    ;;
esac
