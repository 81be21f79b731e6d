// Shared helpers for every kernel file.
//
// Activations are f32 everywhere; weights keep their checkpoint dtype (bf16, f16 or f32) and
// are widened to f32 as they are loaded, so every accumulation is in f32 and results match the
// CPU reference to rounding. `load_w` is the one place that knows how to widen.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "trace.cuh"

__device__ __forceinline__ float load_w(const float* w, size_t i) { return w[i]; }
__device__ __forceinline__ float load_w(const __nv_bfloat16* w, size_t i) { return __bfloat162float(w[i]); }
__device__ __forceinline__ float load_w(const __half* w, size_t i) { return __half2float(w[i]); }

// A KV cache element written from f32: kept as it is, or rounded to the nearest bf16 (ties to
// even, as the CPU reference's `round_bf16` does).
__device__ __forceinline__ void store_kv(float* p, float x) { *p = x; }
__device__ __forceinline__ void store_kv(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The same over each group of N consecutive lanes (N a power of two ≤ 32); every lane of a
// group gets its group's result.
template <int N>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int o = N / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <int N>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
    for (int o = N / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a whole block of blockDim.x threads (a multiple of 32, at most 1024).
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    int nwarps = blockDim.x >> 5;
    v = (threadIdx.x < nwarps) ? partial[threadIdx.x] : 0.f;
    if (warp == 0) v = warp_sum(v);
    if (threadIdx.x == 0) partial[0] = v;
    __syncthreads();
    float r = partial[0];
    __syncthreads();
    return r;
}

// The argmax order on (value, index) pairs: the higher value, then the lower index; NaN never
// wins (every comparison with it is false), so a best that starts at (−inf, ~0) never becomes
// NaN. The order is total on the pairs it admits, so a reduction's result does not depend on
// the order it combines them in.
__device__ __forceinline__ bool better(float v, uint32_t i, float bv, uint32_t bi) {
    return v > bv || (v == bv && i < bi);
}

// Programmatic dependent launch (sm_90+). Kernels the host launches with the PDL attribute may
// start while the previous kernel is still draining; each calls pdl_trigger() first (so its own
// successor can be scheduled as soon as all of its blocks are resident) and pdl_wait() before it
// reads or writes anything another kernel produces or consumes. Only reads of weights, which
// no kernel writes, may come before the wait. Both are no-ops on older GPUs and when the kernel
// was launched normally.
// What another kernel produced must not be read through the non-coherent path either
// (ld.global.nc: a plain read through a `const T* __restrict__`, or __ldg), even in code after
// the wait: ptxas takes such a load for a read of memory that is constant while the kernel
// runs and may schedule it above griddepcontrol.wait. It did so for attention_tc's Q at head
// dim 128 (SASS: LDG.E.128.CONSTANT before ACQBULK), and a verify step then read queries that
// qkv_rope_append had not yet written. Such reads use __ldcg (or a pointer without
// __restrict__); the plain test `pdl_kernels_read_produced_data_coherently` checks the PTX.
// In the trace build both also stamp the block's record (trace.cuh).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    trace_start();
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    trace_ready();
}

// 16 bytes global → shared without passing through registers (sm_80+); with `valid` false the
// destination is zero-filled and nothing is read. cp_async_commit closes a group of them and
// cp_async_wait_all waits for all of this thread's groups.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// The part of a split-KV attention launch one block owns (attention.cu, attention_tc.cu): grid
// Positions live in device memory so that one captured CUDA graph serves every step:
// lens[0] = the position of the step's first row (also its first cache row), lens[1] = kv_len,
// the cache rows attention reads. The host writes them before the step's launches.
//
// x = KV head × query group (the groups of one head adjacent), y = key slice. Query qi of the
// head's group (0 ≤ qi < Q = rows · G) is query head kvh·G + qi % G of row qi / G; the block
// takes queries q0 .. q0 + per_block and its slice's tiles (split_block_at). Partials are laid out [slice, row, nh].
// qi / G by a multiply: a runtime division compiles to ~20 instructions (signed, through a float
// reciprocal), and a block decomposed up to a dozen query indices per thread that way — a tenth
// of the tensor-core kernel's instructions at one tile per block. With ginv = ⌈2³²/G⌉ (64-bit, so
// that G = 1 gives 2³²), ⌊qi·ginv / 2³²⌋ = ⌊qi / G⌋ exactly while qi·G < 2³² (here qi < 2¹⁶ and
// G < 2¹⁶); the one division is per thread, not per query.
struct SplitBlock {
    int G, Q, kvh, q0, split, stride, j0, step;  // the slice's first tile at j0, then every step keys
    unsigned long long ginv;
    bool active;  // false for slices past this step's keys (the grid is sized for a graph's most)
    // The query's row, its head, its row's partial slot in this slice.
    __device__ __forceinline__ int row(int qi) const { return (int)(((unsigned long long)(unsigned)qi * ginv) >> 32); }
    __device__ __forceinline__ int head(int qi) const { return kvh * G + (qi - row(qi) * G); }
    __device__ __forceinline__ size_t slot(int qi, int rows, int nh) const {
        return ((size_t)split * rows + row(qi)) * nh + head(qi);
    }
};
// Where one thread's 16-byte loads of a split-attention K/V tile come from, for a block of
// THREADS threads and rows of DC 16-byte chunks: thread i loads keys i / DC + KSTEP·n of a tile
// (KSTEP = THREADS / DC), chunk column i % DC, so its addresses are one base pointer plus
// (tile's first key + KSTEP·n) · row. Worked out once per block: 64-bit index arithmetic per
// load was ~10 integer instructions each (~115 of a tensor-core warp's ~860 per tile). C is the
// chunk type: float4 for f32 caches, uint4 (8 bf16) for bf16 ones (KvElem below).
template <typename C>
struct TileRowsT {
    const C* k;  // this thread's chunk of K at key 0 of the cache
    const C* v;
    size_t row;  // chunks from one cache row to the next (nkv · DC)
    int key0;    // this thread's first key within a tile
};
using TileRows = TileRowsT<float4>;
template <int THREADS, int DC, typename C = float4, typename E>
__device__ __forceinline__ TileRowsT<C> tile_rows(const E* k, const E* v, int nkv, int kvh) {
    TileRowsT<C> t;
    t.key0 = threadIdx.x / DC;
    t.row = (size_t)nkv * DC;
    const size_t at = (size_t)t.key0 * t.row + (size_t)kvh * DC + threadIdx.x % DC;
    t.k = reinterpret_cast<const C*>(k) + at;
    t.v = reinterpret_cast<const C*>(v) + at;
    return t;
}

// A KV cache element type of the split-attention kernels: float (4 per 16-byte chunk, loaded as
// float4) or __nv_bfloat16 (8 per chunk, loaded as uint4: half the bytes of a cache row). Both
// kernels widen a chunk to f32 as they put it in shared memory, so their math is the same for
// both; `exact_tf32` says that every value is already a TF32 number (a bf16 has 8 significant
// bits, TF32 11), so the tensor-core kernel hands K and V to its MMAs unsplit and drops the
// products with their (zero) small parts.
template <typename E>
struct KvElem;
template <>
struct KvElem<float> {
    using Chunk = float4;
    static constexpr int PER_CHUNK = 4;
    static constexpr bool exact_tf32 = false;  // and no widen: f32 chunks are stored as they are
    __device__ static __forceinline__ float4 zero() { return make_float4(0.f, 0.f, 0.f, 0.f); }
};
template <>
struct KvElem<__nv_bfloat16> {
    using Chunk = uint4;
    static constexpr int PER_CHUNK = 8;
    static constexpr bool exact_tf32 = true;
    // bf16 → f32 is the 16 bits shifted up: each 32-bit word holds elements 2i (low half) and
    // 2i + 1 (high half).
    __device__ static __forceinline__ void widen(const uint4& c, float4& lo, float4& hi) {
        lo = make_float4(__uint_as_float(c.x << 16), __uint_as_float(c.x & 0xffff0000u), __uint_as_float(c.y << 16),
                         __uint_as_float(c.y & 0xffff0000u));
        hi = make_float4(__uint_as_float(c.z << 16), __uint_as_float(c.z & 0xffff0000u), __uint_as_float(c.w << 16),
                         __uint_as_float(c.w & 0xffff0000u));
    }
    __device__ static __forceinline__ uint4 zero() { return make_uint4(0u, 0u, 0u, 0u); }
};

// The step's slice count: kv_len / keys rounded up, at least 1, at most max_splits (the
// attention kernels pass their fixed stride, attention_combine_f32 the grid's slices, which the
// host sizes as min(stride, the most keys a captured graph may see / keys): the same count).
__device__ __forceinline__ int split_count(int kv_len, int keys, int max_splits) {
    return max(1, min(max_splits, (kv_len + keys - 1) / keys));
}
// The keys of one tile of the split attentions (attention.cu TK, attention_tc.cu TC_TK).
#define SPLIT_TILE 32
// The block (bx, by) of a split attention whose slices interleave `stride` ways: slice s takes
// the 32-key tiles s, s + stride, s + 2·stride, … of the step's keys, in that order. stride is
// fixed for a kernel, a model and a GPU (the host's split_plan), never derived from kv_len or
// the row count, so a query row's tiles, and hence its partials' bits, are the same in every
// step that holds it: a decode step of one row, a verify step of eight, a longer step after
// it (lens[1] larger), a graph's wider grid. Keys past the row's last visible one are masked
// (p = 0, an exact no-op on the running max, sum and Σ p·v), so they change nothing.
// (A slice used to take one contiguous run of ⌈kv_len / splits⌉ keys: its boundaries moved
// with kv_len, and a row's sums with them.)
__device__ __forceinline__ SplitBlock split_block_at(int rows, int nh, int nkv, int kv_len, int stride, int per_block,
                                                     unsigned bx, unsigned by) {
    SplitBlock b;
    b.G = nh / nkv;
    b.ginv = b.G == 1 ? 1ull << 32 : 0xffffffffu / (unsigned)b.G + 1u;
    b.Q = rows * b.G;
    const int groups = (b.Q + per_block - 1) / per_block;
    b.kvh = bx / groups;
    b.q0 = (bx % groups) * per_block;
    b.split = by;
    b.stride = stride;
    b.active = b.split < split_count(kv_len, SPLIT_TILE, stride);
    b.j0 = b.split * SPLIT_TILE;
    b.step = stride * SPLIT_TILE;
    return b;
}
__device__ __forceinline__ SplitBlock split_block(int rows, int nh, int nkv, int kv_len, int stride, int per_block) {
    return split_block_at(rows, nh, nkv, kv_len, stride, per_block, blockIdx.x, blockIdx.y);
}

// One sequence of a segmented attention launch (a batched step's rows of several sequences,
// each over its own caches; crates/dspark-kernels/src/cuda/attention_seg.rs writes the table,
// one entry per layer and sequence, as nine 64-bit words). Launches index it by blockIdx.z.
struct AttnSeg {
    const float* qkv;  // the sequence's rows of the q|k|v projection
    float* q;          // its normalised, rotated queries
    void* k;           // this layer's K and V caches of the sequence (the launch's element type)
    void* v;
    float* part_o;     // its split partials (splits · rows · nh of them)
    float* part_ml;
    float* out;        // its attention output rows
    const int* lens;   // [first_pos, kv_len], host-written
    int rows;
    int splits;        // its slice count, as its own launch would size the grid
};
