#!/usr/bin/env bash
# Warp stall breakdown (cycles per issued instruction by reason) of one kernel launch under ncu.
# Usage: bash scripts/exp/stalls.sh KERNEL_REGEX -- command...
set -euo pipefail
k="$1"; shift; [ "$1" = "--" ] && shift
r=""
for s in barrier long_scoreboard short_scoreboard math_pipe_throttle mio_throttle wait lg_throttle dispatch_stall not_selected selected no_instruction membar drain imc_miss branch_resolving tex_throttle sleeping misc; do
  r="$r,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"
done
ncu --clock-control none --launch-skip 5 --launch-count 1 -k "regex:$k" --metrics "gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,smsp__thread_inst_executed_per_inst_executed.ratio${r}" "$@" 2>&1 | grep -E "stalled|duration|inst_executed|warps_active|\(" | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | awk '{ if (NF >= 3 && $NF+0 < 0.05 && $0 ~ /ratio|stalled/) next; print }'
