// RMSNorm, y = x / sqrt(mean(x²) + eps) · w, per row of `dim` values, f32.
//
// rmsnorm_f32: out = norm(x). (The residual adds that precede it are fused into the matvec
// that produces them, in accumulate mode.)
//
// On the tensor-core path the norm costs no launch of its own: the matvec that writes the
// residual also writes x·w and per-block partial sums of squares, and the consuming matvec
// scales its output by 1/rms (kernels/matvec.cu). rms_finish_f32 completes such rows in place,
// u[r] *= 1/sqrt(Σ_p ss[r, p] / dim + eps), for a consumer that cannot take that path.
// Launch: one block per row, 1024 threads. When the host says the rows are whole, aligned float4s
// (vec4) and dim is at most 4096 (every Qwen3 up to 8B), each thread owns one float4 of the row: its weights are loaded before the
// wait for the previous kernel (nothing writes them), x is loaded once and kept in registers
// through the block reduction, so the critical path after the wait is one load, one reduction
// and one store. Other shapes take a strided loop over the row.
#include "common.cuh"

extern "C" __global__ void rmsnorm_f32(const float* x, const float* w, float* out, int dim, float eps, int vec4) {
    pdl_trigger();
    const float* xr = x + (size_t)blockIdx.x * dim;
    float* o = out + (size_t)blockIdx.x * dim;
    if (vec4 && dim <= 4 * (int)blockDim.x) {
        const int i = threadIdx.x;
        const bool mine = 4 * i < dim;
        float4 wv = make_float4(0.f, 0.f, 0.f, 0.f), xv = wv;
        if (mine) wv = reinterpret_cast<const float4*>(w)[i];
        pdl_wait();
        if (mine) xv = reinterpret_cast<const float4*>(xr)[i];
        const float ss = xv.x * xv.x + xv.y * xv.y + xv.z * xv.z + xv.w * xv.w;
        const float inv = rsqrtf(block_sum(ss) / dim + eps);
        if (mine)
            reinterpret_cast<float4*>(o)[i] =
                make_float4(xv.x * inv * wv.x, xv.y * inv * wv.y, xv.z * inv * wv.z, xv.w * inv * wv.w);
        return;
    }
    pdl_wait();
    float ss = 0.f;
#pragma unroll 4
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = rsqrtf(block_sum(ss) / dim + eps);
#pragma unroll 4
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}

// One block of 256 threads per row; warp 0 reduces the `parts` partial sums in the same order as
// the matvec epilogue (lane-strided, then a butterfly), so both give the same 1/rms.
extern "C" __global__ void rms_finish_f32(float* u, const float* ss, int parts, int dim, float eps) {
    pdl_trigger();
    pdl_wait();
    __shared__ float inv;
    if (threadIdx.x < 32) {
        float s = 0.f;
        for (int j = threadIdx.x; j < parts; j += 32) s += ss[(size_t)blockIdx.x * parts + j];
        s = warp_sum(s);
        if (threadIdx.x == 0) inv = rsqrtf(s / dim + eps);
    }
    __syncthreads();
    float* row = u + (size_t)blockIdx.x * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) row[i] *= inv;
}
