// Qwen3's per-head RMSNorm + NeoX RoPE for one head vector, and the decode attention's folded
// form of qkv_rope_append (rope.cu).
//
// Math, for a head vector v of hd values at position pos, norm weights w, i < hd/2:
//   inv = 1 / sqrt(Σ v² / hd + eps),  a = v[i]·inv·w[i],  b = v[i + hd/2]·inv·w[i + hd/2],
//   angle = pos · inv_freq[i],  v[i] ← a·cos − b·sin,  v[i + hd/2] ← b·cos + a·sin.
// The helpers below fix every rounding (explicit _rn intrinsics, so no contraction is left to
// the compiler) and are the only code that computes it on the device: rope.cu's block-per-head
// kernel and the decode attention's warp-per-head fold give the same bits, which a GPU test
// checks (gpu_kernels/rope_fold.rs).
//
// Why a fold: in a decode step the norm + RoPE + append launch sits between q|k|v and the
// attention, 36 times a step, and in the chain replica it took ~2.3 µs a layer from q|k|v's end
// to its own (docs/perf.md), for ~1 µs of work. The decode attention can do the same work
// itself (attention.cu, `attention_split_rope_q1_*`): every block normalises and rotates the
// four queries it owns, and the block whose key slice holds the step's new row also computes its
// key and value, stores them to the caches for later steps and writes them into its shared-
// memory tile, where the tile's own loads of that (not yet written) row landed stale values.
// Measured: decode ±0 to −0.6%. The tensor-core attention's blocks own 32 queries each and
// every key slice would redo them; that twin was slower (9.55 → 11.68 µs at 512 keys, verify
// +1.5–1.9%: docs/perf.md, "What was tried and lost").
#pragma once
#include "common.cuh"

// One pair's square sum, a + b² rounded as rope.cu has always added them: b² first.
__device__ __forceinline__ float norm_sq_pair(float a, float b) { return __fmaf_rn(a, a, __fmul_rn(b, b)); }

// The normalised, rotated pair (a, b) = (v[i], v[i + hd/2]) given inv = 1/rms.
__device__ __forceinline__ void norm_rope_pair(float& a, float& b, float inv, float wa, float wb, float c, float s) {
    const float x = __fmul_rn(__fmul_rn(a, inv), wa), y = __fmul_rn(__fmul_rn(b, inv), wb);
    a = __fmaf_rn(x, c, -__fmul_rn(y, s));
    b = __fmaf_rn(y, c, __fmul_rn(x, s));
}

// cos and sin of a rotation angle. Not inlined: each precise cosf / sinf brings its slow
// argument reduction along, and inlined at every call site it doubled to tripled the folded
// kernels' PTX (the calls run before the PDL wait, block_rotations below).
__device__ __noinline__ float2 rope_cos_sin(float angle) { return make_float2(cosf(angle), sinf(angle)); }

// 1/rms from the sum of squares, as rope.cu computes it.
__device__ __forceinline__ float norm_inv(float sum_sq, int hd, float eps) { return rsqrtf(sum_sq / hd + eps); }

// What the folded kernels read and write besides the attention's own operands: the q|k|v
// projection output qkv [rows, (nh + 2·nkv)·hd] (raw: q heads, k heads, v heads), the norm
// weights and frequencies, and the caches to append the step's rows to (the same caches the
// attention reads: those rows are written here and never read back from memory by this launch).
template <typename E>
struct RopeIn {
    const float* qkv;
    const float* q_norm;    // [hd]
    const float* k_norm;    // [hd]
    const float* inv_freq;  // [hd/2]
    E* k_cache;
    E* v_cache;
    float eps;
};

// One head vector held by a warp, lane owning dims lane + 32·e (PER = hd/32 values): pair e
// (< PER/2) is (dim lane + 32e, dim lane + 32e + hd/2) = (x[e], x[e + PER/2]). The norm weights
// and the rotations depend on weights and positions only, so the kernels load and work them out
// before their PDL wait.
template <int PER>
__device__ __forceinline__ void warp_norm_weights(const float* norm, float (&w)[PER]) {
    static_assert(PER == 2 || PER == 4, "head dim 64 or 128");
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int e = 0; e < PER; e++) w[e] = norm[lane + 32 * e];
}
// The rotations of a step's rows, (cos, sin) of (first_pos + r)·inv_freq[i] at rot[r·hd/2 + i]
// for r < rows, worked out once per block by all of its threads (then a barrier). Precise cos and
// sin are ~100 instructions a pair: each lane working out its own pairs for every query it
// stages (five pairs a lane in the tensor-core kernel) made that kernel 3.7–5 µs slower.
__device__ __forceinline__ void block_rotations(float2* rot, const float* inv_freq, int first_pos, int rows, int half) {
    for (int i = threadIdx.x; i < rows * half; i += blockDim.x) {
        const int r = i / half, f = i - r * half;
        rot[i] = rope_cos_sin((float)(first_pos + r) * inv_freq[f]);
    }
}

// x normalised and rotated in place by its row's rotations rot (block_rotations' row); every
// lane of the warp must call it. The sum of squares is
// added in rope.cu's order: its block of hd/2 threads holds pair e of every lane in warp e, each
// warp sums its pairs by the same butterfly, and the warps' sums are added in order.
template <int PER>
__device__ __forceinline__ void warp_norm_rope(float (&x)[PER], const float (&w)[PER], const float2* rot, float eps) {
    constexpr int HALF = PER / 2;
    float sum = 0.f;
#pragma unroll
    for (int e = 0; e < HALF; e++) {
        const float part = warp_sum(norm_sq_pair(x[e], x[e + HALF]));
        sum = e == 0 ? part : sum + part;
    }
    const float inv = norm_inv(sum, 32 * PER, eps);
#pragma unroll
    for (int e = 0; e < HALF; e++) {
        const float2 cs = rot[(threadIdx.x & 31) + 32 * e];
        norm_rope_pair(x[e], x[e + HALF], inv, w[e], w[e + HALF], cs.x, cs.y);
    }
}

// A cache element as the cache keeps it, widened back to f32: what the attention would have
// read from the cache had the row been appended by an earlier launch.
__device__ __forceinline__ float as_kept(float x, const float*) { return x; }
__device__ __forceinline__ float as_kept(float x, const __nv_bfloat16*) {
    return __bfloat162float(__float2bfloat16_rn(x));
}

// Head `head` of row `row` of the raw q|k|v output, a warp's lane holding dims lane + 32·e. qkv
// is the previous kernel's output: read through L2 after the PDL wait (__ldcg, common.cuh).
template <int PER>
__device__ __forceinline__ void warp_load_head(const float* qkv, int row, int head, int heads, float (&x)[PER]) {
    const float* src = qkv + ((size_t)row * heads + head) * (32 * PER) + (threadIdx.x & 31);
#pragma unroll
    for (int e = 0; e < PER; e++) x[e] = __ldcg(src + 32 * e);
}

// One of the step's new rows, appended by one warp of a folded attention kernel: the key of KV
// head kvh at position pos normalised and rotated, the value copied, both stored to the caches
// and kept in k, v as the cache keeps them (for the block's own tile).
template <int PER, typename E>
struct FoldRow {
    float w[PER], k[PER], v[PER];
    __device__ __forceinline__ void setup(const RopeIn<E>& rp) { warp_norm_weights<PER>(rp.k_norm, w); }
    __device__ __forceinline__ void load(const RopeIn<E>& rp, int row, int nh, int nkv, int kvh) {
        warp_load_head<PER>(rp.qkv, row, nh + kvh, nh + 2 * nkv, k);
        warp_load_head<PER>(rp.qkv, row, nh + nkv + kvh, nh + 2 * nkv, v);
    }
    __device__ __forceinline__ void append(const RopeIn<E>& rp, int pos, int nkv, int kvh, const float2* rot) {
        warp_norm_rope<PER>(k, w, rot, rp.eps);
        const size_t at = ((size_t)pos * nkv + kvh) * (32 * PER) + (threadIdx.x & 31);
#pragma unroll
        for (int e = 0; e < PER; e++) {
            store_kv(rp.k_cache + at + 32 * e, k[e]);
            store_kv(rp.v_cache + at + 32 * e, v[e]);
            k[e] = as_kept(k[e], rp.k_cache);
            v[e] = as_kept(v[e], rp.v_cache);
        }
    }
};
