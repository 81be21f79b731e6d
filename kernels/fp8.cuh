// E4M3 ("fn") weights widened on the tensor-core path, and where their block scales live.
//
// Qwen's FP8 checkpoints store each linear as E4M3 bytes W_q [out, in] with one scale per
// [bn, bk] block: W[o, k] = e4m3(W_q[o, k]) · scale[o / bn, k / bk] (crates/dspark-model/src/
// checkpoint/fp8.rs). Every E4M3 value is exactly an f16 (4 significant bits, exponents 2^-9 ..
// 2^8, inside f16's normal range), so the matvec widens the bytes to f16 and multiplies them on
// f16 tensor-core MMAs with f32 accumulation, and applies the scale to the f32 partial sums of
// each 64-wide k chunk (a chunk lies in one scale block: bk is a power of two ≥ 64).
//
// The widening is one instruction per pair on sm_89+ (`cvt.rn.f16x2.e4m3x2`, exact; the NaN
// code S.1111.111 gives NaN, as the CPU reference decodes it). sm_80 has no such instruction:
// there it is bit placement plus one exact multiply — the byte S.EEEE.MMM moved to f16 bits
// S.0EEEE.MMM0000000 reads as the same value times 2^-8 (bias 15 in place of 7; E = 0 lands on
// f16 subnormals of the same mantissa), and an f16x2 multiply by 2^8 restores it (the NaN code
// becomes ±480 there). f16 and not bf16: bf16 would need that multiply on every GPU, and the
// widening is most of an FP8 matvec's instructions.
//
// x is f32; f16 parts of it cannot cover f32's exponent range, so split_x_f16x2 (fp8.cu) first
// scales each activation row by a power of two 2^s that puts its largest |x| in [2^14, 2^15),
// then splits y = x·2^s into two f16 parts hi + lo: hi = f16(y) keeps 11 bits, lo = f16(y − hi)
// the next 11 of the (at most 13-bit) remainder, so hi + lo is within 2^-23·|y| of y — under
// one f32 ulp of each element (a third part would make it exact, at 1.5× the bytes of x the
// matvec loads per weight, which is what bounds it at eight rows). The matvec multiplies 2^-s
// back onto each row's sums (exact: a power of two). Elements smaller than ~2^-25 of the row's
// largest lose more, to f16's subnormal range: an absolute error below 2^-39 · max|x|.
//
// The bytes lie row-major, or in tile order where the shape allows (rows a multiple of 16,
// columns of 64; crates/dspark-kernels/src/cuda/ops.rs `Fp8Buf`): a tile of 16 rows, chunk of 64
// columns is 1 KB — row g's 16 bytes at k = 16t.. of the chunk for lane (g, t) of an MMA, rows
// 0–7 in the first 512 bytes and rows 8–15 in the second, lane 4g + t at 16 bytes each — and
// the chunks of a tile follow each other. A warp's load of a chunk is then 512 contiguous
// bytes a row half, where row-major gives sixteen 64-byte pieces 4 KB or more apart: the
// one-row FP8 chain of a Qwen3-8B layer took 76.2 → 72.1 µs on an H100 (probe/tma.cu, branch
// persist-probe), the same bits.
//
// Scales on the device are f32, stacked for every matrix of a fused projection (q|k|v,
// gate|up) in one table [scale rows, cols]; `srow[o]` is the scale row of image row o, so one
// lookup serves row orders the host builds (stacked or interleaved).
#pragma once
#include "common.cuh"

// The block scales of an FP8 weight: scale [rows, cols] f32, srow [out] the scale row of each
// weight row, cols the scale blocks per row, kb_log2 = log2(bk).
struct Fp8Scales {
    const float* scale;
    const uint32_t* srow;
    int cols;
    int kb_log2;
    // x scaled and split into two f16 parts by split_x_f16x2 (fp8.cu), planes of `plane` u32
    // pairs: hi, then lo, each [m, in] as f16 pairs, the launch's rows from `xs` on; after them,
    // as f32, each row's 2^-s.
    const uint32_t* xs;
    int plane;
    // Whether the bytes are in tile order (above).
    int tiled;
};

// Where byte (o, k) of an FP8 matrix of `in` columns lies (the general kernels'; tiled as above).
__device__ __forceinline__ size_t fp8_offset(int o, int k, int in, int tiled) {
    if (!tiled) return (size_t)o * in + k;
    const int r = o & 15, t = (k >> 4) & 3;
    return ((size_t)(o >> 4) * (in >> 6) + (k >> 6)) * 1024 + (r >> 3) * 512 + ((r & 7) * 4 + t) * 16 + (k & 15);
}

// Two E4M3 bytes (the low 16 bits of v: first byte in the low lane) as an f16x2.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t v) {
#if __CUDA_ARCH__ >= 890
    uint32_t r;
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(r) : "r"(v));
    return r;
#else
    const uint32_t p = __byte_perm(v, 0u, 0x1404);  // byte 0 to bits 15..8, byte 1 to 31..24
    const uint32_t bits = ((p & 0x7f007f00u) >> 1) | (p & 0x80008000u);
    __half2 h = *reinterpret_cast<const __half2*>(&bits);
    h = __hmul2(h, __floats2half2_rn(256.f, 256.f));
    return *reinterpret_cast<uint32_t*>(&h);
#endif
}

// Half h of 16 E4M3 bytes (k .. k + 15 of one row) as an 8-value f16 chunk in the layout of a
// 16-byte 16-bit load: h = 0 gives k .. k + 7, h = 1 k + 8 .. k + 15.
__device__ __forceinline__ uint4 e4m3x8_to_f16(const uint4& v, int h) {
    const uint32_t a = h ? v.z : v.x, b = h ? v.w : v.y;
    return make_uint4(e4m3x2_to_f16x2(a), e4m3x2_to_f16x2(a >> 16), e4m3x2_to_f16x2(b), e4m3x2_to_f16x2(b >> 16));
}

// The f32 value of one E4M3 byte (the general kernels; the same placement, then f32).
__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
    const uint32_t p = (uint32_t)b << 8;
    const uint32_t bits = ((p & 0x7f00u) >> 4) | (p & 0x8000u);
    return __uint_as_float(bits << 16) * 0x1p120f;
}

// The m16n8k16 MMA on f16 operands with f32 accumulation (the fragment layout of mma_bf16's).
__device__ __forceinline__ void mma_f16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two f32 values (already scaled into f16's range) as hi/lo f16 pairs: hi = f16_rn(y),
// lo = f16_rn(y − hi); the difference is exact in f32.
__device__ __forceinline__ void split2_f16(float a, float b, uint32_t& hi, uint32_t& lo) {
    const __half2 h = __floats2half2_rn(a, b);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(a - hf.x, b - hf.y);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
}

// The power of two s that puts a row's largest |x| (mx) in [2^14, 2^15): 2^e ≤ mx < 2^(e+1) from
// the exponent bits (an infinite mx gives e = 128: the parts then hold inf and NaN, and so will
// the sums, as they should); s = 14 − e, kept where 2^±s is normal.
__device__ __forceinline__ int x_split_exp(float mx) {
    const int e = (int)((__float_as_uint(mx) >> 23) & 0xffu) - 127;
    return max(-126, min(126, 14 - e));
}

// How many 16-byte loads of x a thread has in flight at once in block_abs_max and the two-pass form
// of split_x_block (rows wider than its one read).
// Written as a loop over k with a runtime bound, the loads compiled to one LDG at a time, each
// followed by its bounds branch and its use: a row of 12,288 (down_proj's x) was twelve L2 round
// trips in series per thread before the first weight was multiplied (sm_90 SASS, ptxas 13.0).
#define XSPLIT_BATCH 4

// The largest of the block's threads' values (≥ 0), every thread given it: the warps' maxima
// through shared memory.
__device__ __forceinline__ float block_max(float mx) {
    __shared__ float wmax[32];
    mx = warp_max(mx);
    if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) mx = fmaxf(mx, wmax[w]);
    return mx;
}

// The largest |x| of a row of `in` (a multiple of 4) f32, every thread of the block given it:
// XSPLIT_BATCH 16-byte loads a thread a batch, all issued before any is used, then the warps'
// maxima through shared memory. (fmaxf is exact and ignores NaN in any order: the maximum does
// not depend on how the loads are grouped.)
__device__ __forceinline__ float block_abs_max(const float* x, int in) {
    float mx = 0.f;
    const int step = 4 * blockDim.x;
    for (int k0 = 4 * threadIdx.x; k0 < in; k0 += XSPLIT_BATCH * step) {
        float4 v[XSPLIT_BATCH];
#pragma unroll
        for (int j = 0; j < XSPLIT_BATCH; j++) {
            const int k = k0 + j * step;
            v[j] = k < in ? *reinterpret_cast<const float4*>(x + k) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < XSPLIT_BATCH; j++)
            mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v[j].x), fabsf(v[j].y)), fmaxf(fabsf(v[j].z), fabsf(v[j].w))));
    }
    return block_max(mx);
}

// Group q (values 4q .. 4q + 3) of a row scaled by `up`, split: its hi pairs at xs[2q ..], its lo
// pairs `lo_at` further on.
__device__ __forceinline__ void split_quad(float4 v, float up, int q, int lo_at, uint32_t* xs) {
    uint2 hi, lo;
    split2_f16(v.x * up, v.y * up, hi.x, lo.x);
    split2_f16(v.z * up, v.w * up, hi.y, lo.y);
    *reinterpret_cast<uint2*>(xs + 2 * q) = hi;  // pairs 2q, 2q + 1
    *reinterpret_cast<uint2*>(xs + lo_at + 2 * q) = lo;
}

// This thread's groups threadIdx.x + j · blockDim.x (j < Q) of a row of `quads` 16-byte groups,
// all requested before any is used (zeros past the row), and their largest |x|.
template <int Q>
__device__ __forceinline__ float load_groups(const float* x, int quads, float4 (&v)[Q]) {
#pragma unroll
    for (int j = 0; j < Q; j++) {
        const int q = threadIdx.x + j * blockDim.x;
        v[j] = q < quads ? *reinterpret_cast<const float4*>(x + 4 * q) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    float mx = 0.f;
#pragma unroll
    for (int j = 0; j < Q; j++)
        mx = fmaxf(mx, fmaxf(fmaxf(fabsf(v[j].x), fabsf(v[j].y)), fmaxf(fabsf(v[j].z), fabsf(v[j].w))));
    return mx;
}

// One row of x split by the whole block into `xs` (shared memory: hi [in/2] f16 pairs, lo [in/2],
// then 2^-s as f32) — split_x_f16x2's arithmetic (fp8.cu) for a launch of one row, so the
// one-row matvecs need no launch before them. A row of at most 4 · Q · blockDim.x values is read
// once: each thread requests its up to Q 16-byte groups at once, the block takes their largest
// |x|, and each thread splits its groups from its registers (one L2 round trip, as fp8.cu's
// split_x_f16x2_row). A wider row is read twice, from L2 then L1: once for its largest |x|, once
// for the pairs, each pass in batches of XSPLIT_BATCH 16-byte loads a thread (two pairs a load).
// The same parts either way (fmaxf's maximum does not depend on the grouping). Q is the caller's
// register budget: the weights of its first step are in flight beside these loads. Ends with a
// barrier: the parts are the block's to read.
template <int Q>
__device__ __forceinline__ void split_x_block(const float* x, int in, uint32_t* xs) {
    const int pairs = in / 2, quads = in / 4;
    int s;
    if (quads <= Q * (int)blockDim.x) {
        float4 v[Q];
        s = x_split_exp(block_max(load_groups(x, quads, v)));
        const float up = __uint_as_float((uint32_t)(127 + s) << 23);
#pragma unroll
        for (int j = 0; j < Q; j++) {
            const int q = threadIdx.x + j * blockDim.x;
            if (q < quads) split_quad(v[j], up, q, pairs, xs);
        }
    } else {
        s = x_split_exp(block_abs_max(x, in));
        const float up = __uint_as_float((uint32_t)(127 + s) << 23);
        for (int q0 = threadIdx.x; q0 < quads; q0 += XSPLIT_BATCH * blockDim.x) {
            float4 v[XSPLIT_BATCH];
#pragma unroll
            for (int j = 0; j < XSPLIT_BATCH; j++) {
                const int q = q0 + j * blockDim.x;
                v[j] = q < quads ? *reinterpret_cast<const float4*>(x + 4 * q) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int j = 0; j < XSPLIT_BATCH; j++) {
                const int q = q0 + j * blockDim.x;
                if (q < quads) split_quad(v[j], up, q, pairs, xs);
            }
        }
    }
    if (threadIdx.x == 0) reinterpret_cast<float*>(xs + 2 * (size_t)pairs)[0] = __uint_as_float((uint32_t)(127 - s) << 23);
    __syncthreads();
}

// ---- E4M3 activations (experiment `DSPARK_FP8_A8=1`, branch w8a8) ----
// x quantized as Qwen, vLLM and transformers run `Qwen3-8B-FP8` (`activation_scheme: dynamic`):
// per row and 128-wide k group, s = max|x| / 448 and xq = e4m3_rn_satfinite(x / s), so the
// m16n8k32 E4M3 MMA takes the weight bytes as they lie in memory and a group's sums are scaled
// by scale_w · s. sm_89+ has the MMA; on sm_90 ptxas lowers it to F2FP unpacks of both operands
// and two f16 HMMAs (SASS), so what it saves there is x's second part: one MMA column a row
// where f16 x takes two. Built in the sm_89 and sm_90 PTX (the sm_80 build traps); Ada runs
// the MMA itself (SASS of matvec_tc_a8_fp8 for sm_89: 8 QMMA and no F2FP).

// The m16n8k32 MMA on E4M3 operands with f32 accumulation. A lane's 16 bytes of a row are its
// k slots (4t..4t+3, 16+4t..16+4t+3 in the first, the next 8 bytes in the second MMA), as x's.
__device__ __forceinline__ void mma_e4m3(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
#if __CUDA_ARCH__ >= 890
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// Two f32 as E4M3 bytes (a in the low byte), rounded to nearest, saturating to ±448.
__device__ __forceinline__ uint32_t f32x2_to_e4m3x2(float a, float b) {
#if __CUDA_ARCH__ >= 890
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
    return r;
#else
    __trap();
    return 0;
#endif
}

// One 128-value group of a row, four values a lane (v): its scale s = max|x| / 448 (0 for an
// all-zero group, whose bytes are then 0) and this lane's four E4M3 bytes.
__device__ __forceinline__ uint32_t quant_group_e4m3(float4 v, float& s) {
    s = warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)))) / 448.f;
    if (!(s > 0.f)) return 0u;
    return f32x2_to_e4m3x2(__fdiv_rn(v.x, s), __fdiv_rn(v.y, s)) |
           (f32x2_to_e4m3x2(__fdiv_rn(v.z, s), __fdiv_rn(v.w, s)) << 16);
}

// One row of x quantized by the whole block into `xs` (shared memory: in bytes, then in / 128
// f32 scales) — quant_x_e4m3's arithmetic (fp8.cu) for a launch of one row. Warp w takes groups
// w, w + warps, …, Q at a time with their loads in flight together. Ends with a barrier.
template <int Q>
__device__ __forceinline__ void quant_x_block(const float* x, int in, uint32_t* xs) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5, groups = in >> 7;
    float* sx = reinterpret_cast<float*>(xs + in / 4);
    for (int g0 = warp; g0 < groups; g0 += Q * nw) {
        float4 v[Q];
#pragma unroll
        for (int j = 0; j < Q; j++) {
            const int gi = g0 + j * nw;
            v[j] = gi < groups ? *reinterpret_cast<const float4*>(x + gi * 128 + 4 * lane)
                               : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < Q; j++) {
            const int gi = g0 + j * nw;
            if (gi < groups) {  // warp-uniform
                float s;
                xs[gi * 32 + lane] = quant_group_e4m3(v[j], s);
                if (lane == 0) sx[gi] = s;
            }
        }
    }
    __syncthreads();
}
