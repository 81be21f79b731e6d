#!/usr/bin/env bash
# Runs the GPU test tier from .gpu-bundle/ (built by `cargo xtask test --gpu`) on a machine
# with an NVIDIA GPU and driver but no Rust (unpacking .gpu-bundle-xz/bundle.tar.xz first when
# .gpu-bundle/ is empty: scripts/unbundle.sh): the kernel and whole-model tests (and the FP8 and
# matvec ones again on the sm_80 PTX), then both under
# compute-sanitizer memcheck and racecheck (small shapes only: DSPARK_GPU_SMALL=1, since the
# sanitizer slows kernels 10-100×). Logs go to $OUT (or ./gpu-tier-logs) as logs.tar.gz plus
# summary.txt; the summary table is printed last. GPU_TIER_ONLY=REGEX runs only the runs whose
# names match (a device call's 10 minutes do not hold the whole tier); the rest are listed as not run.
set -uo pipefail
cd "$(dirname "$0")/.."
export DSPARK_ROOT="$PWD"
bash scripts/unbundle.sh
out="${OUT:-$PWD/gpu-tier-logs}"
logs="${GPU_TIER_LOGS:-$(mktemp -d)}"  # GPU_TIER_LOGS=$OUT/logs keeps them if the call is cut short
mkdir -p "$logs"
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
summary=()
fail=0
run() {  # name, limit in seconds, command...
    local name=$1 limit=$2; shift 2
    if [ -n "${GPU_TIER_ONLY:-}" ] && ! [[ $name =~ $GPU_TIER_ONLY ]]; then
        summary+=("$name: NOT run (GPU_TIER_ONLY=$GPU_TIER_ONLY)")
        return
    fi
    local start=$SECONDS
    timeout "$limit" "$@" >"$logs/$name.log" 2>&1
    local rc=$?
    local res; res=$(grep -E '^test result:' "$logs/$name.log" | tail -1)
    local san; san=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/$name.log" | tail -1)
    summary+=("$(printf '%-18s rc=%-3s %4ss  %s %s' "$name" "$rc" $((SECONDS - start)) "$res" "$san")")
    echo "${summary[-1]}"
    [ "$rc" = 0 ] || fail=1
}
run gpu_kernels 240 .gpu-bundle/gpu_kernels --test-threads=1
run gpu_model 300 .gpu-bundle/gpu_model --test-threads=1
run gpu_upload 120 .gpu-bundle/gpu_upload --test-threads=1
# Tensor parallel over NCCL needs two GPUs (and libnccl.so: torch's nvidia-nccl wheel ships
# libnccl.so.2, linked here under the name cudarc loads); on one GPU it is reported as not run.
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then
    nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), "lib"))' 2>/dev/null)
    mkdir -p "$logs/nccl-lib"
    [ -n "$nccl" ] && ln -sf "$nccl/libnccl.so.2" "$logs/nccl-lib/libnccl.so"
    run nccl_tp 120 env LD_LIBRARY_PATH="$logs/nccl-lib:${LD_LIBRARY_PATH:-}" .gpu-bundle/gpu_model --test-threads=1 --ignored nccl_ranks
else
    summary+=("nccl_tp: one GPU here ($gpus): tensor parallel over NCCL NOT run")
fi
# The sm_80 PTX on this GPU (DSPARK_PTX=sm80: no PDL, FP8 widened in software): the kernels
# whose code differs by architecture, and an FP8 model.
run sm80_kernels 150 env DSPARK_PTX=sm80 .gpu-bundle/gpu_kernels --test-threads=1 fp8 matvec tensor_core norm_fold pdl_policy
run sm80_model 60 env DSPARK_PTX=sm80 .gpu-bundle/gpu_model --test-threads=1 fp8_targets
# Ada's sm_89 build of the FP8 modules (DSPARK_PTX=sm89: E4M3 widened by cvt, the E4M3 MMA, no
# PDL; the other modules on sm_80), JIT-compiled for this GPU: the FP8 kernels and models.
run sm89_kernels 200 env DSPARK_PTX=sm89 .gpu-bundle/gpu_kernels --test-threads=1 fp8 matvec norm_fold wide_fp8 pdl_policy
run sm89_model 90 env DSPARK_PTX=sm89 .gpu-bundle/gpu_model --test-threads=1 fp8
if command -v compute-sanitizer >/dev/null; then
    export DSPARK_GPU_SMALL=1
    san="compute-sanitizer --error-exitcode 9"
    run memcheck_kernels 120 $san --tool memcheck .gpu-bundle/gpu_kernels --test-threads=1
    run racecheck_kernels 480 $san --tool racecheck .gpu-bundle/gpu_kernels --test-threads=1
    run memcheck_model 120 $san --tool memcheck .gpu-bundle/gpu_model --test-threads=1 draft_proposals_match_the_cpu_draft fixture_targets bf16_pairs graph_replays head_dim_128 kv_bf16 gemm_prefill_matches fp8_targets batched paged split_targets bf16_activations_stay
    run racecheck_model 60 $san --tool racecheck .gpu-bundle/gpu_model --test-threads=1 draft_proposals_match_the_cpu_draft
else
    summary+=("compute-sanitizer not found: sanitizer runs NOT done")
    fail=1
fi
tar -czf "$out/logs.tar.gz" -C "$logs" .
{
    echo "== GPU tier on ${gpu:-unknown GPU}, $(date -u +%Y-%m-%dT%H:%MZ) =="
    printf '%s\n' "${summary[@]}"
} | tee "$out/summary.txt"
exit $fail
