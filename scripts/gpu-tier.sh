#!/usr/bin/env bash
# Runs the GPU test tier from .gpu-bundle/ (built by `cargo xtask test --gpu`) on a machine
# with an NVIDIA GPU and driver but no Rust: the kernel tests and whole-model tests, then the
# kernel tests again under compute-sanitizer memcheck and racecheck. Logs go to $OUT (or
# ./gpu-tier-logs); the last lines are a summary table.
set -uo pipefail
cd "$(dirname "$0")/.."
export DSPARK_ROOT="$PWD"
out="${OUT:-$PWD/gpu-tier-logs}"
mkdir -p "$out"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
summary=()
run() {  # name, command...
    local name=$1; shift
    local start=$SECONDS
    "$@" >"$out/$name.log" 2>&1
    local rc=$?
    local res; res=$(grep -E '^test result:' "$out/$name.log" | tail -1)
    summary+=("$(printf '%-26s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - start)) "$res")")
    return $rc
}
fail=0
run gpu_kernels .gpu-bundle/gpu_kernels --test-threads=1 || fail=1
run gpu_model .gpu-bundle/gpu_model --test-threads=1 || fail=1
if command -v compute-sanitizer >/dev/null; then
    run memcheck_kernels compute-sanitizer --tool memcheck --error-exitcode 9 .gpu-bundle/gpu_kernels --test-threads=1 || fail=1
    run racecheck_kernels compute-sanitizer --tool racecheck --error-exitcode 9 .gpu-bundle/gpu_kernels --test-threads=1 || fail=1
    run memcheck_model compute-sanitizer --tool memcheck --error-exitcode 9 .gpu-bundle/gpu_model --test-threads=1 golden_dspark_runs_on_the_gpu draft_proposals_match_the_cpu_draft || fail=1
    run racecheck_model compute-sanitizer --tool racecheck --error-exitcode 9 .gpu-bundle/gpu_model --test-threads=1 golden_dspark_runs_on_the_gpu || fail=1
else
    summary+=("compute-sanitizer not found: sanitizer runs NOT done")
    fail=1
fi
echo "== GPU tier on ${gpu:-unknown GPU}, $(date -u +%Y-%m-%dT%H:%MZ) =="
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
exit $fail
