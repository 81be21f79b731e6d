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
// A row per block at a time, four bytes per thread-step.
//
//   split_x_bf16x3:    planes[p][i] = part p of the pair (x[2i], x[2i + 1]) as bf16x2 (mma_bf16.cuh
//                      split3: hi, mid, lo; x = hi + mid + lo exactly)
//
// split_x_bf16x3 runs before each tensor-core FP8 matvec (matvec.cu `matvec_tc_*_fp8`): those
// kernels are bound by instruction issue, not bandwidth (ncu: 34% of issue slots busy but ~210
// instructions per KB of weights against ~62 for bf16), and splitting x in every tile was 88 of
// them; split once here, each tile loads the three parts instead. The MMAs see the same bf16
// values in the same order, so the sums are those of splitting in the tile, bit for bit.
#include "common.cuh"
#include "fp8.cuh"
#include "mma_bf16.cuh"

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
    // A row per block at a time (its scale row looked up once), four bytes per thread-step where
    // the rows are whole words: no 64-bit division per element, 4-byte loads, 8-byte stores.
    for (int o = blockIdx.x; o < rows; o += gridDim.x) {
        const uint8_t* wr = w + (size_t)o * in;
        const float* s = scale + (size_t)srow[o] * scale_cols;
        __nv_bfloat16* orow = out + (size_t)o * in;
        if ((in & 3) == 0) {
            for (int k = 4 * threadIdx.x; k < in; k += 4 * blockDim.x) {
                const uint32_t v = *reinterpret_cast<const uint32_t*>(wr + k);
                const __nv_bfloat162 lo = __floats2bfloat162_rn(e4m3_to_f32(v & 0xff) * s[k / kb],
                                                                e4m3_to_f32((v >> 8) & 0xff) * s[(k + 1) / kb]);
                const __nv_bfloat162 hi = __floats2bfloat162_rn(e4m3_to_f32((v >> 16) & 0xff) * s[(k + 2) / kb],
                                                                e4m3_to_f32(v >> 24) * s[(k + 3) / kb]);
                uint2 pair;
                pair.x = *reinterpret_cast<const uint32_t*>(&lo);
                pair.y = *reinterpret_cast<const uint32_t*>(&hi);
                *reinterpret_cast<uint2*>(orow + k) = pair;
            }
        } else {
            for (int k = threadIdx.x; k < in; k += blockDim.x) orow[k] = __float2bfloat16_rn(e4m3_to_f32(wr[k]) * s[k / kb]);
        }
    }
}

extern "C" __global__ void split_x_bf16x3(const float* x, uint32_t* planes, int pairs) {
    pdl_trigger();
    pdl_wait();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < pairs; i += gridDim.x * blockDim.x) {
        uint32_t hi, mid, lo;
        split3(x[2 * i], x[2 * i + 1], hi, mid, lo);
        planes[i] = hi;
        planes[pairs + i] = mid;
        planes[2 * pairs + i] = lo;
    }
}
