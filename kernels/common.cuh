// Shared helpers for every kernel file.
//
// Activations are f32 everywhere; weights keep their checkpoint dtype (bf16, f16 or f32) and
// are widened to f32 as they are loaded, so every accumulation is in f32 and results match the
// CPU reference to rounding. `load_w` is the one place that knows how to widen.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ float load_w(const float* w, size_t i) { return w[i]; }
__device__ __forceinline__ float load_w(const __nv_bfloat16* w, size_t i) { return __bfloat162float(w[i]); }
__device__ __forceinline__ float load_w(const __half* w, size_t i) { return __half2float(w[i]); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a whole block of blockDim.x threads (a multiple of 32, at most 1024).
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    int nwarps = blockDim.x >> 5;
    v = (threadIdx.x < nwarps) ? partial[threadIdx.x] : 0.f;
    if (warp == 0) v = warp_sum(v);
    if (threadIdx.x == 0) partial[0] = v;
    __syncthreads();
    float r = partial[0];
    __syncthreads();
    return r;
}
