// Argmax over each row of logits: the greedy token, lowest index on ties, NaN never wins.
//
// logits [rows, vocab] f32 with a row stride (so one slot of a block can be reduced alone);
// out [rows] u32. Launch: one block of 1024 threads per row; each thread scans a strided
// subset, then a shared-memory tree keeps (value, index) pairs, preferring the lower index.
#include "common.cuh"

extern "C" __global__ void argmax_f32(const float* logits, uint32_t* out, int vocab, int row_stride) {
    __shared__ float sv[1024];
    __shared__ uint32_t si[1024];
    const float* x = logits + (size_t)blockIdx.x * row_stride;
    float best = -INFINITY;
    uint32_t bi = 0xffffffffu;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = x[i];
        if (v > best) { best = v; bi = i; }
    }
    sv[threadIdx.x] = best;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float ov = sv[threadIdx.x + s];
            uint32_t oi = si[threadIdx.x + s];
            if (ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < si[threadIdx.x])) {
                sv[threadIdx.x] = ov;
                si[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = si[0] == 0xffffffffu ? 0u : si[0];
}
