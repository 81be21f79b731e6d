// Weight-stationary batched matvec: y[m, o] (+)= Σ_k x[m, k] · W[o, k], for m < M ≤ 16.
//
// The lever of small-M decoding: each weight byte is read once for all M activation rows.
// W is [out, in] in the checkpoint dtype, x [M, in] f32, y [M, out] f32. Launch: 8 warps per
// block, one output row per warp; lanes stride over k, each keeping M partial sums in
// registers, then a warp reduction per row. `accumulate` adds into y (residual adds fused into
// the projection that feeds them). Larger M (prefill) is split into chunks of 16 on the host.
#include "common.cuh"

#define MAXM 16

template <typename T>
__device__ void matvec(const T* w, const float* x, float* y, int m, int in, int out, int accumulate) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= out) return;
    float acc[MAXM];
#pragma unroll
    for (int r = 0; r < MAXM; r++) acc[r] = 0.f;
    const size_t base = (size_t)warp * in;
    for (int k = lane; k < in; k += 32) {
        float wv = load_w(w, base + k);
#pragma unroll
        for (int r = 0; r < MAXM; r++)
            if (r < m) acc[r] += wv * x[(size_t)r * in + k];
    }
#pragma unroll
    for (int r = 0; r < MAXM; r++) {
        if (r < m) {
            float s = warp_sum(acc[r]);
            if (lane == 0) {
                size_t idx = (size_t)r * out + warp;
                y[idx] = accumulate ? y[idx] + s : s;
            }
        }
    }
}

extern "C" __global__ void matvec_bf16(const __nv_bfloat16* w, const float* x, float* y, int m, int in, int out, int acc) { matvec(w, x, y, m, in, out, acc); }
extern "C" __global__ void matvec_f16(const __half* w, const float* x, float* y, int m, int in, int out, int acc) { matvec(w, x, y, m, in, out, acc); }
extern "C" __global__ void matvec_f32(const float* w, const float* x, float* y, int m, int in, int out, int acc) { matvec(w, x, y, m, in, out, acc); }
