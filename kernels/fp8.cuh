// E4M3 ("fn") weights widened on the tensor-core path, and where their block scales live.
//
// Qwen's FP8 checkpoints store each linear as E4M3 bytes W_q [out, in] with one scale per
// [bn, bk] block: W[o, k] = e4m3(W_q[o, k]) · scale[o / bn, k / bk] (crates/dspark-model/src/
// checkpoint/fp8.rs). Every E4M3 value is exactly a bf16 (4 significant bits, exponents 2^-9 ..
// 2^8), so the matvec widens the bytes to bf16 and multiplies them on the same bf16 tensor-core
// MMAs as bf16 weights, and applies the scale to the f32 partial sums of each 64-wide k chunk
// (a chunk lies in one scale block: bk is a power of two ≥ 64).
//
// The widening is bit placement plus one exact multiply: an E4M3 byte S.EEEE.MMM moved to bf16
// bits S.0000EEEE.MMM0000 reads as the same value times 2^-120 (the exponent bias is 127 in
// place of 7), subnormals included (E = 0 lands on bf16 subnormals of the same mantissa), and a
// bf16x2 multiply by 2^120 — a power of two, so exact — restores it. The NaN code S.1111.111
// widens to ±480 instead of NaN (no checkpoint holds it; the CPU reference decodes it as NaN).
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
    // x split into its three bf16 parts by split_x_bf16x3 (fp8.cu), planes of `plane` u32 pairs:
    // hi, then mid, then lo, each [m, in] as bf16 pairs, the launch's rows from `xs` on.
    const uint32_t* xs;
    int plane;
};

// Two E4M3 bytes of v, chosen by a byte-permute selector that puts them in the high bytes of
// the two 16-bit lanes (0x1404: bytes 0, 1; 0x3424: bytes 2, 3), as a bf16x2 (first byte in the
// low lane).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint32_t v, uint32_t sel) {
    const uint32_t p = __byte_perm(v, 0u, sel);
    const uint32_t bits = ((p & 0x7f007f00u) >> 4) | (p & 0x80008000u);
    __nv_bfloat162 b = *reinterpret_cast<const __nv_bfloat162*>(&bits);
    b = __hmul2(b, __floats2bfloat162_rn(0x1p120f, 0x1p120f));
    return *reinterpret_cast<uint32_t*>(&b);
}

// Half h of 16 E4M3 bytes (k .. k + 15 of one row) as an 8-value bf16 chunk in the layout of a
// 16-byte bf16 load: h = 0 gives k .. k + 7, h = 1 k + 8 .. k + 15.
__device__ __forceinline__ uint4 e4m3x8_to_bf16(const uint4& v, int h) {
    const uint32_t a = h ? v.z : v.x, b = h ? v.w : v.y;
    return make_uint4(e4m3x2_to_bf16x2(a, 0x1404), e4m3x2_to_bf16x2(a, 0x3424), e4m3x2_to_bf16x2(b, 0x1404),
                      e4m3x2_to_bf16x2(b, 0x3424));
}

// The f32 value of one E4M3 byte (the general kernels; the same placement, then f32).
__device__ __forceinline__ float e4m3_to_f32(uint8_t b) {
    const uint32_t p = (uint32_t)b << 8;
    const uint32_t bits = ((p & 0x7f00u) >> 4) | (p & 0x8000u);
    return __uint_as_float(bits << 16) * 0x1p120f;
}
