// The element-wise ops around the prefill's GEMMs: activations f32 in, the GEMM's input dtype out.
//
// A prefill chunk (hundreds to thousands of rows) runs every projection as one cuBLAS GEMM on
// the tensor cores (crates/dspark-kernels/src/cuda/gemm.rs). cuBLAS multiplies two operands of
// one type, so the f32 activations that feed a bf16 (or f16) weight matrix are rounded to that
// type first, once, where they are produced: the RMSNorm writes its output rounded, the SwiGLU
// writes silu(gate) ⊙ up rounded, and the attention output is rounded by a cast. That rounding
// is the one difference from the small-M path, which keeps activations f32-exact (its matvec
// splits x into three bf16 parts); the residual stream, the GEMM accumulators and outputs, the
// norms' sums and the softmax all stay f32. Every peer's prefill rounds the same way.
//
//   rmsnorm_to_{bf16,f16}:  out[r, i] = round(x[r, i] · 1/√(mean_i x[r, i]² + eps) · w[i])
//   swiglu_pairs_to_{bf16,f16}: act[r, i] = round(silu(gu[r, 2i]) · gu[r, 2i + 1])   (gate|up rows interleaved)
//   cast_to_{bf16,f16}:     y[i] = round(x[i])
//
// round is to nearest, ties to even (__float2bfloat16_rn / __float2half_rn). The f32 results
// before rounding are those of rmsnorm_f32 and swiglu_pairs_f32 (same formulas, same order of
// the sum of squares: a strided loop then block_sum), so the f32-weight path can use those.
// Launch: the norm one block of 1,024 threads per row, as rmsnorm_f32 (a float4 a thread on whole
// aligned float4 rows of at most 4,096 values); the others a grid-stride loop.
#include "common.cuh"

template <typename T> __device__ __forceinline__ T round_to(float v);
template <> __device__ __forceinline__ __nv_bfloat16 round_to<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half round_to<__half>(float v) { return __float2half_rn(v); }

__device__ __forceinline__ float silu_f(float g) { return g / (1.f + expf(-g)); }

template <typename T>
__device__ void rmsnorm_to(const float* x, const float* w, T* out, int dim, float eps, int vec4) {
    pdl_trigger();
    const float* xr = x + (size_t)blockIdx.x * dim;
    T* o = out + (size_t)blockIdx.x * dim;
    // As rmsnorm_f32's vec4 path (kernels/rmsnorm.cu): a float4 a thread, its weights loaded
    // before the wait, x kept in registers through the reduction; the same sum, so the same
    // f32 values before the rounding. Four rounded values go out as one 8-byte store.
    if (vec4 && dim <= 4 * (int)blockDim.x) {
        const int i = threadIdx.x;
        const bool mine = 4 * i < dim;
        float4 wv = make_float4(0.f, 0.f, 0.f, 0.f), xv = wv;
        if (mine) wv = reinterpret_cast<const float4*>(w)[i];
        pdl_wait();
        if (mine) xv = reinterpret_cast<const float4*>(xr)[i];
        const float ss = xv.x * xv.x + xv.y * xv.y + xv.z * xv.z + xv.w * xv.w;
        const float inv = rsqrtf(block_sum(ss) / dim + eps);
        if (mine) {
            T v[4] = {round_to<T>(xv.x * inv * wv.x), round_to<T>(xv.y * inv * wv.y), round_to<T>(xv.z * inv * wv.z),
                      round_to<T>(xv.w * inv * wv.w)};
            reinterpret_cast<uint2*>(o)[i] = *reinterpret_cast<const uint2*>(v);
        }
        return;
    }
    pdl_wait();
    float ss = 0.f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(ss) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = round_to<T>(xr[i] * inv * w[i]);
}

template <typename T>
__device__ void swiglu_pairs_to(const float* gu, T* act, int inter, int rows) {
    pdl_trigger();
    pdl_wait();
    const size_t n = (size_t)inter * rows;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
        const size_t r = idx / inter, i = idx % inter;
        const float2 p = reinterpret_cast<const float2*>(gu)[r * inter + i];
        act[idx] = round_to<T>(silu_f(p.x) * p.y);
    }
}

template <typename T>
__device__ void cast_to(const float* x, T* y, size_t n) {
    pdl_trigger();
    pdl_wait();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = round_to<T>(x[i]);
}

#define PREFILL_OPS(SUF, T)                                                                                        \
    extern "C" __global__ void rmsnorm_to_##SUF(const float* x, const float* w, T* out, int dim, float eps,        \
                                                int vec4) {                                                         \
        rmsnorm_to<T>(x, w, out, dim, eps, vec4);                                                                   \
    }                                                                                                               \
    extern "C" __global__ void swiglu_pairs_to_##SUF(const float* gu, T* act, int inter, int rows) {               \
        swiglu_pairs_to<T>(gu, act, inter, rows);                                                                   \
    }                                                                                                               \
    extern "C" __global__ void cast_to_##SUF(const float* x, T* y, int n) { cast_to<T>(x, y, (size_t)n); }

PREFILL_OPS(bf16, __nv_bfloat16)
PREFILL_OPS(f16, __half)
