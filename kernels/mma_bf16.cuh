// The tensor-core building blocks of the bf16 matvecs (matvec.cu, including the one-row Markov
// step): the f32-exact split of x into three bf16 parts, the m16n8k16 MMA, one 32-wide k chunk
// of a 16-row tile as six MMAs, and the per-step weight and x loads of a warp. The layout and
// the reasons are in matvec.cu's header.
#pragma once
#include "common.cuh"

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
    __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Splits two f32 values into hi/mid/lo bf16 pairs (x = hi + mid + lo exactly for normal x):
// hi = bf16_rn(x), mid = bf16_rn(x − hi), lo = x − hi − mid. The split runs for every value of x
// in every step of every tile, about half of a matvec loop's instructions, so it is written for
// few conversions (slower than integer and FADD instructions): one packing conversion rounds
// both values of a pair, and each half of the pair reads back as f32 by a shift or a mask.
// lo needs no rounding: x has 24 significant bits, hi takes 8 and mid the next 8 (RN leaves
// |x − hi| ≤ half an ulp of hi), so lo has at most 8 and is a bf16 value already; its upper 16
// bits, taken by a byte permute, are it.
__device__ __forceinline__ void split3(float a, float b, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
    hi = pack_bf16(a, b);  // low half bf16_rn(a), high half bf16_rn(b)
    const float ar = a - __uint_as_float(hi << 16), br = b - __uint_as_float(hi & 0xffff0000u);
    mid = pack_bf16(ar, br);
    const float al = ar - __uint_as_float(mid << 16), bl = br - __uint_as_float(mid & 0xffff0000u);
    lo = __byte_perm(__float_as_uint(al), __float_as_uint(bl), 0x7632);
}

__device__ __forceinline__ void mma_bf16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 32-wide k chunk of a tile: the lane's 8 consecutive k of rows g (va) and g + 8 (vb) times
// its 8 x values, split into three bf16 parts, as six MMAs into the three part accumulators.
// MMA 0 takes real k +0..+3, MMA 1 real k +4..+7 (see the header for the mapping).
__device__ __forceinline__ void mma_chunk3(float (*acc)[4], const uint4& va, const uint4& vb, const float* xv) {
    uint32_t h[4], md[4], lo[4];
#pragma unroll
    for (int j = 0; j < 4; j++) split3(xv[2 * j], xv[2 * j + 1], h[j], md[j], lo[j]);
    mma_bf16(acc[0], va.x, vb.x, va.y, vb.y, h[0], h[1]);
    mma_bf16(acc[1], va.x, vb.x, va.y, vb.y, md[0], md[1]);
    mma_bf16(acc[2], va.x, vb.x, va.y, vb.y, lo[0], lo[1]);
    mma_bf16(acc[0], va.z, vb.z, va.w, vb.w, h[2], h[3]);
    mma_bf16(acc[1], va.z, vb.z, va.w, vb.w, md[2], md[3]);
    mma_bf16(acc[2], va.z, vb.z, va.w, vb.w, lo[2], lo[3]);
}

// The same chunk with x rounded to bf16 (`--activations bf16`, the `_x1` kernels): one part, two
// MMAs into the first accumulator — a third of the tensor work and of the split's instructions,
// which is what bounds launches of more than 8 rows; x loses its f32 exactness.
__device__ __forceinline__ void mma_chunk1(float (*acc)[4], const uint4& va, const uint4& vb, const float* xv) {
    uint32_t h[4];
#pragma unroll
    for (int j = 0; j < 4; j++) h[j] = pack_bf16(xv[2 * j], xv[2 * j + 1]);
    mma_bf16(acc[0], va.x, vb.x, va.y, vb.y, h[0], h[1]);
    mma_bf16(acc[0], va.z, vb.z, va.w, vb.w, h[2], h[3]);
}

__device__ __forceinline__ void load_x8(const float* x, int row, int k, int in, float* v) {
    const float* p = x + (size_t)row * in + k;
    float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// Four f32 of what another kernel produced, by a plain (weak, coherent) global load: neither
// the non-coherent path nor a strong load. After pdl_wait only: the asm is volatile, so it stays
// below the wait's.
__device__ __forceinline__ float4 ld_global_f4(const float* p) {
    float4 v;
    asm volatile("ld.global.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

// Sixteen bytes of what another kernel produced (eight bf16 values), the same plain load.
__device__ __forceinline__ uint4 ld_global_u4(const uint16_t* p) {
    uint4 v;
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// Streams a weight chunk past L1 (it is read once; x stays cached there) and asks L2 to fetch
// the row's whole 256-byte block: the neighbouring 64-byte chunks belong to the same warp's
// next chunk or to its sibling warps, so one DRAM burst serves four requests.
__device__ __forceinline__ uint4 ldg_stream(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// One step's weights for a lane: UNROLL 16-byte chunks of rows wa and wb (its rows g and g + 8 of
// the tile) at k = chunk + u·stride + EPV·t, EPV weights per 16 bytes (8 bf16, 16 E4M3). Lanes
// past kend load zeros instead of leaving: mma.sync needs all 32 lanes.
template <int UNROLL, int EPV = 8>
__device__ __forceinline__ void load_w_step(const uint4* wa, const uint4* wb, int chunk, int stride, int kend, int t,
                                            uint4* va, uint4* vb) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int k = chunk + u * stride + EPV * t;
        if (k < kend) {
            va[u] = ldg_stream(wa + k / EPV);
            vb[u] = ldg_stream(wb + k / EPV);
        } else {
            va[u] = make_uint4(0, 0, 0, 0);
            vb[u] = make_uint4(0, 0, 0, 0);
        }
    }
}

// The same step's x: 8 consecutive k of activation row g per chunk (zeros past kend, and for the
// lanes whose row g is past the launch's m).
// load_x_step over x stored as bf16 rows (the `_x1h` kernels): each value widened to f32
// exactly, so mma_chunk1's rounding gives back the stored bits.
template <int UNROLL>
__device__ __forceinline__ void load_xh_step(const uint16_t* x, int g, int chunk, int stride, int kend, int in,
                                             bool has_x, int t, float (*xv)[8]) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int k = chunk + u * stride + 8 * t;
        if (has_x && k < kend) {
            const uint4 h = ld_global_u4(x + (size_t)g * in + k);
            const uint32_t w[4] = {h.x, h.y, h.z, h.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                xv[u][2 * j] = __uint_as_float(w[j] << 16);
                xv[u][2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) xv[u][i] = 0.f;
        }
    }
}

template <int UNROLL>
__device__ __forceinline__ void load_x_step(const float* x, int g, int chunk, int stride, int kend, int in, bool has_x,
                                            int t, float (*xv)[8]) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int k = chunk + u * stride + 8 * t;
        if (has_x && k < kend) {
            load_x8(x, g, k, in, xv[u]);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) xv[u][i] = 0.f;
        }
    }
}
