// The general kernels of FP8 block-scaled weights (fp8.cuh has the format and the widening):
//
//   matvec_fp8:        y[m, o] (+)= Σ_k x[m, k] · e4m3(W_q[o, k]) · scale[srow[o], k / bk]
//   dequant_fp8_bf16:  W[o, k] = bf16_rn(e4m3(W_q[o, k]) · scale[srow[o], k / bk])
//
// matvec_fp8 is the fallback of the tensor-core FP8 matvec (matvec.cu `matvec_tc_*_fp8`) for
// what that kernel does not take — in not a multiple of 16, a scale block that is not a power of
// two ≥ 64, unaligned buffers — and the per-row reference shape of the general `matvec_*`: one
// output row per warp, lanes strided over k, up to 16 rows of x, each weight dequantized in f32
// (one rounding, as the CPU reference's dequantization) before its multiply.
//
// dequant_fp8_bf16 feeds the prefill's cuBLAS GEMMs (crates/dspark-kernels/src/cuda/gemm.rs):
// cuBLAS multiplies bf16 by bf16, so a chunk's FP8 matrix is widened into a bf16 scratch matrix
// first, each weight rounded once to bf16 after its scale (e4m3 · scale has up to 12 significant
// bits; bf16 keeps 8: a relative rounding of at most 2^-9, as the prefill's bf16 activations).
// Four bytes per thread, grid-stride.
#include "common.cuh"
#include "fp8.cuh"

#define MAXM 16

extern "C" __global__ void matvec_fp8(const uint8_t* w, const float* x, float* y, int m, int in, int out, int acc,
                                      const float* scale, const uint32_t* srow, int scale_cols, int kb) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    pdl_trigger();
    pdl_wait();
    if (warp >= out) return;
    float a[MAXM];
#pragma unroll
    for (int r = 0; r < MAXM; r++) a[r] = 0.f;
    const size_t base = (size_t)warp * in;
    const float* s = scale + (size_t)srow[warp] * scale_cols;
    for (int k = lane; k < in; k += 32) {
        const float wv = e4m3_to_f32(w[base + k]) * s[k / kb];
#pragma unroll
        for (int r = 0; r < MAXM; r++)
            if (r < m) a[r] += wv * x[(size_t)r * in + k];
    }
#pragma unroll
    for (int r = 0; r < MAXM; r++) {
        if (r < m) {
            const float v = warp_sum(a[r]);
            if (lane == 0) {
                const size_t idx = (size_t)r * out + warp;
                y[idx] = acc ? y[idx] + v : v;
            }
        }
    }
}

extern "C" __global__ void dequant_fp8_bf16(const uint8_t* w, const float* scale, const uint32_t* srow,
                                            __nv_bfloat16* out, int rows, int in, int scale_cols, int kb) {
    pdl_trigger();
    pdl_wait();
    const size_t n = (size_t)rows * in;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t o = i / in;
        const int k = (int)(i % in);
        const float v = e4m3_to_f32(w[i]) * scale[(size_t)srow[o] * scale_cols + k / kb];
        out[i] = __float2bfloat16_rn(v);
    }
}
