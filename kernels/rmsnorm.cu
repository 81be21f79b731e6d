// RMSNorm, y = x / sqrt(mean(x²) + eps) · w, per row of `dim` values, f32.
//
// rmsnorm_f32: out = norm(x). (The residual adds that precede it are fused into the matvec
// that produces them, in accumulate mode.)
// Launch: one block per row, 1024 threads, so a 4096-wide row is four loads per thread in flight
// at once (the loops are unrolled); the sum of squares is a block reduction.
#include "common.cuh"

extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float* out, int dim, float eps) {
    pdl_trigger();
    pdl_wait();
    const float* xr = x + (size_t)blockIdx.x * dim;
    float ss = 0.f;
#pragma unroll 4
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = rsqrtf(block_sum(ss) / dim + eps);
    float* o = out + (size_t)blockIdx.x * dim;
#pragma unroll 4
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}
