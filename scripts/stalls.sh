#!/usr/bin/env bash
# Where a kernel's time goes, from ncu: duration, DRAM and L1/L2 throughput, issue activity,
# occupancy, instructions, and the warp stall breakdown (cycles per issued instruction by reason)
# of each matching launch, one CSV row a launch. Run on the GPU machine (ncu, no Rust).
# Usage: bash scripts/stalls.sh KERNEL_REGEX SKIP COUNT -- command...
#   e.g. bash scripts/stalls.sh 'matvec_tc' 40 12 -- .gpu-bundle/dspark bench --weights fp8 --projections-only --iters 2
set -euo pipefail
k="$1" skip="$2" count="$3"; shift 3; [ "$1" = "--" ] && shift
m="gpu__time_duration.sum,launch__grid_size,launch__registers_per_thread,launch__occupancy_limit_registers"
m="$m,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed"
m="$m,l1tex__throughput.avg.pct_of_peak_sustained_active,sm__inst_issued.avg.pct_of_peak_sustained_active"
m="$m,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
m="$m,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
for s in long_scoreboard short_scoreboard mio_throttle lg_throttle math_pipe_throttle wait not_selected selected barrier no_instruction dispatch_stall drain membar branch_resolving; do
    m="$m,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"
done
ncu --clock-control none --launch-skip "$skip" --launch-count "$count" -k "regex:$k" --metrics "$m" --csv --page raw "$@" 2>/dev/null |
    grep -E '^"(ID|[0-9])' |
    sed 's/smsp__average_warps_issue_stalled_//g; s/_per_issue_active.ratio//g'
