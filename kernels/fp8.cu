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
//   split_x_f16x2[_row]: planes[p][m, i] = part p of (y[m, 2i], y[m, 2i + 1]) as f16x2, y[m] = x[m]·2^s_m
//                      (fp8.cuh split2_f16: hi, lo), then 2^-s_m as f32 after the planes
//
// A split launch runs before each tensor-core FP8 matvec (matvec.cu `matvec_tc_*_fp8`) that does
// not split x in its own blocks; those kernels load the parts instead of splitting x in every tile:
// they are bound by instruction issue (ncu: splitting x in each tile was 88 of ~210 instructions
// per KB of weights). s_m puts row m's largest |x| in [2^14, 2^15) (fp8.cuh says why).
// split_x_f16x2_row (below) splits a row in one block: each thread requests its up to eight 16-byte
// groups of the row at once, the block takes their largest |x|, and each thread splits its groups
// from its registers — one L2 round trip. split_x_f16x2, for rows wider than one block takes (and
// `DSPARK_NO_SPLIT_ROW=1`), is a grid of blocks of a pair a thread along the row, a row per grid
// row, each block finding the row's largest |x| itself — the row read from L2 in batches of four
// 16-byte loads a thread, each batch in flight at once (fp8.cuh `block_abs_max`) — and then reading
// its pairs again: no second launch and no grid barrier, but two round trips. A one-row launch on a
// GPU whose shared memory holds the split row splits it inside the matvec instead (fp8.cuh
// `split_x_block`, the same arithmetic).
#include "common.cuh"
#include "fp8.cuh"

#define MAXM 16

extern "C" __global__ void matvec_fp8(const uint8_t* w, const float* x, float* y, int m, int in, int out, int acc,
                                      const float* scale, const uint32_t* srow, int scale_cols, int kb, int tiled) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    pdl_trigger();
    pdl_wait();
    if (warp >= out) return;
    float a[MAXM];
#pragma unroll
    for (int r = 0; r < MAXM; r++) a[r] = 0.f;
    const float* s = scale + (size_t)srow[warp] * scale_cols;
    for (int k = lane; k < in; k += 32) {
        const float wv = e4m3_to_f32(w[fp8_offset(warp, k, in, tiled)]) * s[k / kb];
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
                                            __nv_bfloat16* out, int rows, int in, int scale_cols, int kb, int tiled) {
    pdl_trigger();
    pdl_wait();
    // A row per block at a time (its scale row looked up once), four bytes per thread-step where
    // the rows are whole words: no 64-bit division per element, 4-byte loads, 8-byte stores.
    // Tiled bytes (fp8.cuh): four consecutive k of a row lie in one 16-byte piece.
    for (int o = blockIdx.x; o < rows; o += gridDim.x) {
        const uint8_t* wr = w + (size_t)o * in;
        const float* s = scale + (size_t)srow[o] * scale_cols;
        __nv_bfloat16* orow = out + (size_t)o * in;
        if ((in & 3) == 0) {
            for (int k = 4 * threadIdx.x; k < in; k += 4 * blockDim.x) {
                const uint32_t v = *reinterpret_cast<const uint32_t*>(w + fp8_offset(o, k, in, tiled));
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
            // Rows of a width that is not whole words are never tiled (64 columns are).
            for (int k = threadIdx.x; k < in; k += blockDim.x) orow[k] = __float2bfloat16_rn(e4m3_to_f32(wr[k]) * s[k / kb]);
        }
    }
}

extern "C" __global__ void split_x_f16x2(const float* x, uint32_t* planes, int in, int plane) {
    pdl_trigger();
    pdl_wait();
    const int m = blockIdx.y;
    const float* xr = x + (size_t)m * in;
    const int s = x_split_exp(block_abs_max(xr, in));
    const float up = __uint_as_float((uint32_t)(127 + s) << 23);
    const int pairs = in / 2;
    uint32_t* row = planes + (size_t)m * pairs;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < pairs; i += gridDim.x * blockDim.x) {
        const float2 v = *reinterpret_cast<const float2*>(xr + 2 * i);
        uint32_t hi, lo;
        split2_f16(v.x * up, v.y * up, hi, lo);
        row[i] = hi;
        row[plane + i] = lo;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0)
        reinterpret_cast<float*>(planes + 2 * (size_t)plane)[m] = __uint_as_float((uint32_t)(127 - s) << 23);
}

// One block a row (grid (1, m)): the row's 16-byte groups, up to SPLIT_ROW_Q a thread, all
// requested at once — one L2 round trip, where split_x_f16x2 takes one for its maximum pass and
// then reads the row again — its largest |x| from the registers, then the same parts and 2^-s.
// For rows of up to 4 · SPLIT_ROW_Q · blockDim.x values (the host keeps split_x_f16x2 beyond), in
// blocks of up to 1024 threads (the bound keeps it within 64 registers: 59 on sm_90, ptxas 13.0).
#define SPLIT_ROW_Q 8
extern "C" __global__ void __launch_bounds__(1024) split_x_f16x2_row(const float* x, uint32_t* planes, int in, int plane) {
    pdl_trigger();
    pdl_wait();
    const int m = blockIdx.y, quads = in / 4;
    float4 v[SPLIT_ROW_Q];
    const int s = x_split_exp(block_max(load_groups(x + (size_t)m * in, quads, v)));
    const float up = __uint_as_float((uint32_t)(127 + s) << 23);
    uint32_t* row = planes + (size_t)m * (in / 2);
#pragma unroll
    for (int j = 0; j < SPLIT_ROW_Q; j++) {
        const int q = threadIdx.x + j * blockDim.x;
        if (q < quads) split_quad(v[j], up, q, plane, row);
    }
    if (threadIdx.x == 0)
        reinterpret_cast<float*>(planes + 2 * (size_t)plane)[m] = __uint_as_float((uint32_t)(127 - s) << 23);
}

// x [m, in] f32 → E4M3 bytes [m, in] at xs, then the groups' scales [m, in / 128] f32 at
// xs + plane / 2 words (plane: the launch's f16 pairs, so the bytes take plane / 2 words): the
// activations of the E4M3-activation kernels (fp8.cuh `quant_group_e4m3`; experiment
// `DSPARK_FP8_A8=1`). A warp a group, grid (⌈groups / 8⌉, m) of 256 threads.
extern "C" __global__ void quant_x_e4m3(const float* x, uint32_t* xs, int in, int plane) {
    const int groups = in >> 7, gi = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    const int r = blockIdx.y;
    pdl_trigger();
    pdl_wait();
    if (gi >= groups) return;  // warp-uniform
    const float4 v = *reinterpret_cast<const float4*>(x + (size_t)r * in + gi * 128 + 4 * lane);
    float s;
    const uint32_t q = quant_group_e4m3(v, s);
    xs[(size_t)r * (in / 4) + gi * 32 + lane] = q;
    if (lane == 0) reinterpret_cast<float*>(xs + plane / 2)[(size_t)r * groups + gi] = s;
}
