nvcc -arch=sm_90 -O3 -std=c++17 -I kernels scripts/exp/attn.cu -o /tmp/attn || exit 1
export KEYS=32 SPLITS=32
bash scripts/exp/stalls.sh attention_tc -- /tmp/attn tc 512 10
SPLITS=16 bash scripts/exp/stalls.sh attention_split -- /tmp/attn q1 512 10
ncu --clock-control none --launch-skip 5 --launch-count 1 -k regex:attention_tc --metrics gpu__time_duration.sum,sm__cycles_active.avg,smsp__cycles_active.avg,dram__bytes_read.sum,lts__t_bytes.sum,sm__inst_executed_pipe_tensor.sum,smsp__inst_executed.sum /tmp/attn tc 512 10 2>&1 | grep -E "duration|cycles|bytes|inst"
