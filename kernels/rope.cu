// Per-head RMSNorm followed by NeoX RoPE: Qwen3's q_norm/k_norm + rotary step.
//
// Row r sits at absolute position first_pos + r. For each head vector:
// v = v / sqrt(mean(v²) + eps) · w, then for i < hd/2 with angle = pos · inv_freq[i]:
//   v[i] ← v[i]·cos − v[i+hd/2]·sin,  v[i+hd/2] ← v[i+hd/2]·cos + v[i]·sin.
// inv_freq is precomputed on the host exactly as the CPU reference does; hd ≤ 512. The
// arithmetic is norm_rope.cuh's, shared with the attention kernels that fold this step in.
#include "norm_rope.cuh"

// Thread i < hd/2 holds (a, b) = (v[i], v[i + hd/2]) of one head vector, its norm weights
// (wa, wb) and its rotation (c, s); the block normalises the vector and writes it rotated to dst.
// Every thread of the block must call it (the sum of squares is a block reduction).
// D is float (q_out, an f32 cache) or __nv_bfloat16 (a bf16 cache: the result rounded once).
template <typename D>
__device__ __forceinline__ void norm_rope_store(float a, float b, float wa, float wb, float c, float s, D* dst, int i,
                                                int half, int hd, float eps) {
    const float inv = norm_inv(block_sum(norm_sq_pair(a, b)), hd, eps);
    if (i < half) {
        norm_rope_pair(a, b, inv, wa, wb, c, s);
        store_kv(dst + i, a);
        store_kv(dst + i + half, b);
    }
}

// Fused post-projection step of attention for a few rows: the q|k|v projection output
// qkv [rows, (nq + 2·nkv)·hd] (q heads, then k heads, then v heads) is turned into
//   q heads: RMSNorm(q_norm) + RoPE, written to q_out [rows, nq, hd];
//   k heads: RMSNorm(k_norm) + RoPE, written straight into the K cache at row first_pos + r;
//   v heads: copied into the V cache at row first_pos + r.
// first_pos = lens[0] is read from device memory (common.cuh), so a captured graph serves every
// position.
// One launch replaces two norm+rope launches and two cache copies; nq = 0 (keys and values
// only) is allowed. Launch: one block of hd/2 threads (rounded up
// to a warp multiple) per (row, head) with heads = nq + 2·nkv. E is the cache element: the
// `_kvbf16` kernel rounds k and v to bf16 as it stores them (q stays f32).
template <typename E>
__device__ void qkv_rope_append(const float* qkv, const float* q_norm, const float* k_norm, const float* inv_freq,
                                float* q_out, E* k_cache, E* v_cache, int nq, int nkv, int hd, const int* lens,
                                float eps, unsigned bx) {
    pdl_trigger();
    // Written by the host before the step (not by a kernel): safe to read before the wait.
    const int first_pos = lens[0], cache_row = first_pos;
    const int heads = nq + 2 * nkv;
    const int row = bx / heads, head = bx % heads;
    const float* src = qkv + ((size_t)row * heads + head) * hd;
    const int half = hd / 2, i = threadIdx.x;
    const bool is_v = head >= nq + nkv, is_q = head < nq;
    // The norm weights and the rotation depend only on the weights and the position, not on
    // the projection: they are loaded and computed before the wait for the previous kernel.
    const float* w = is_q ? q_norm : k_norm;
    float wa = 0.f, wb = 0.f, c = 1.f, s = 0.f;
    if (!is_v && i < half) {
        wa = w[i];
        wb = w[i + half];
        const float2 cs = rope_cos_sin((float)(first_pos + row) * inv_freq[i]);
        c = cs.x;
        s = cs.y;
    }
    pdl_wait();
    float a = 0.f, b = 0.f;
    if (i < half) { a = src[i]; b = src[i + half]; }
    if (is_v) {  // v: plain copy (uniform branch per block)
        E* dst = v_cache + ((size_t)(cache_row + row) * nkv + (head - nq - nkv)) * hd;
        if (i < half) { store_kv(dst + i, a); store_kv(dst + i + half, b); }
        return;
    }
    if constexpr (sizeof(E) == sizeof(float)) {  // one call (the block reduction inlined once)
        float* dst = is_q ? q_out + ((size_t)row * nq + head) * hd
                          : k_cache + ((size_t)(cache_row + row) * nkv + (head - nq)) * hd;
        norm_rope_store(a, b, wa, wb, c, s, dst, i, half, hd, eps);
    } else if (is_q) {
        norm_rope_store(a, b, wa, wb, c, s, q_out + ((size_t)row * nq + head) * hd, i, half, hd, eps);
    } else {
        norm_rope_store(a, b, wa, wb, c, s, k_cache + ((size_t)(cache_row + row) * nkv + (head - nq)) * hd, i, half,
                        hd, eps);
    }
}
extern "C" __global__ void qkv_rope_append_f32(const float* qkv, const float* q_norm, const float* k_norm,
                                               const float* inv_freq, float* q_out, float* k_cache, float* v_cache,
                                               int nq, int nkv, int hd, const int* lens, float eps) {
    qkv_rope_append(qkv, q_norm, k_norm, inv_freq, q_out, k_cache, v_cache, nq, nkv, hd, lens, eps, blockIdx.x);
}
extern "C" __global__ void qkv_rope_append_f32_kvbf16(const float* qkv, const float* q_norm, const float* k_norm,
                                                      const float* inv_freq, float* q_out, __nv_bfloat16* k_cache,
                                                      __nv_bfloat16* v_cache, int nq, int nkv, int hd,
                                                      const int* lens, float eps) {
    qkv_rope_append(qkv, q_norm, k_norm, inv_freq, q_out, k_cache, v_cache, nq, nkv, hd, lens, eps, blockIdx.x);
}

// The segmented twins (attention_tc.cu `attention_tc_seg_*`): blockIdx.z the sequence, x its
// (row, head); blocks past its rows leave. The table is host-written: read before the wait.
template <typename E>
__device__ void qkv_rope_append_seg(const AttnSeg* segs, const float* q_norm, const float* k_norm,
                                    const float* inv_freq, int nq, int nkv, int hd, float eps) {
    const AttnSeg sg = segs[blockIdx.z];
    if ((int)blockIdx.x >= sg.rows * (nq + 2 * nkv)) return;
    qkv_rope_append(sg.qkv, q_norm, k_norm, inv_freq, sg.q, reinterpret_cast<E*>(sg.k), reinterpret_cast<E*>(sg.v),
                    nq, nkv, hd, sg.lens, eps, blockIdx.x);
}
extern "C" __global__ void qkv_rope_append_seg_f32(const AttnSeg* segs, const float* q_norm, const float* k_norm,
                                                   const float* inv_freq, int nq, int nkv, int hd, float eps) {
    qkv_rope_append_seg<float>(segs, q_norm, k_norm, inv_freq, nq, nkv, hd, eps);
}
extern "C" __global__ void qkv_rope_append_seg_f32_kvbf16(const AttnSeg* segs, const float* q_norm,
                                                          const float* k_norm, const float* inv_freq, int nq, int nkv,
                                                          int hd, float eps) {
    qkv_rope_append_seg<__nv_bfloat16>(segs, q_norm, k_norm, inv_freq, nq, nkv, hd, eps);
}

// The draft's context rows for all of its layers in one launch (cuda_dspark.rs): kv [rows,
// layers, 2·nkv, hd] is the output of one matvec over every layer's k_proj|v_proj rows stacked,
// k_norm [layers, hd] the layers' k_norm weights; layer l's caches are k_caches[l] and
// v_caches[l] (device arrays of pointers, written at load). Each row goes to cache row
// first_pos + r of every layer: k heads normalised and rotated, v heads copied, as above with
// nq = 0. One launch instead of one per layer, after one matvec instead of one per layer: the
// five 16.8 MB k|v projections of DSpark-8B ran at about a third of the copy ceiling each.
// With layer_major set, kv is [layers, rows, 2·nkv, hd] instead: one projection per layer, each
// a view of that layer's own k|v rows (a draft that holds no stacked copy, to save its bytes).
// Launch: one block of hd/2 threads (rounded up to a warp multiple) per (row, layer, head).
// E is the caches' element, as in qkv_rope_append.
template <typename E>
__device__ void kv_rope_append_layers(const float* kv, const float* k_norm, const float* inv_freq,
                                      E* const* k_caches, E* const* v_caches, int layers, int nkv, int hd,
                                      const int* lens, float eps, int layer_major) {
    pdl_trigger();
    const int first_pos = lens[0];  // host-written, like the cache pointers: safe before the wait
    const int heads = layers * 2 * nkv;
    const int rows = gridDim.x / heads;
    const int row = blockIdx.x / heads, lh = blockIdx.x % heads;
    const int layer = lh / (2 * nkv), head = lh % (2 * nkv);
    const float* src = kv + (layer_major ? ((size_t)layer * rows + row) * (2 * nkv) + head
                                         : (size_t)row * heads + lh) * hd;
    const int half = hd / 2, i = threadIdx.x;
    const bool is_v = head >= nkv;
    float wa = 0.f, wb = 0.f, c = 1.f, s = 0.f;
    if (!is_v && i < half) {
        wa = k_norm[(size_t)layer * hd + i];
        wb = k_norm[(size_t)layer * hd + i + half];
        const float2 cs = rope_cos_sin((float)(first_pos + row) * inv_freq[i]);
        c = cs.x;
        s = cs.y;
    }
    const size_t at = ((size_t)(first_pos + row) * nkv + (is_v ? head - nkv : head)) * hd;
    E* dst = (is_v ? v_caches[layer] : k_caches[layer]) + at;
    pdl_wait();
    float a = 0.f, b = 0.f;
    if (i < half) { a = src[i]; b = src[i + half]; }
    if (is_v) {
        if (i < half) { store_kv(dst + i, a); store_kv(dst + i + half, b); }
        return;
    }
    norm_rope_store(a, b, wa, wb, c, s, dst, i, half, hd, eps);
}
extern "C" __global__ void kv_rope_append_layers_f32(const float* kv, const float* k_norm, const float* inv_freq,
                                                     float* const* k_caches, float* const* v_caches, int layers,
                                                     int nkv, int hd, const int* lens, float eps, int layer_major) {
    kv_rope_append_layers(kv, k_norm, inv_freq, k_caches, v_caches, layers, nkv, hd, lens, eps, layer_major);
}
extern "C" __global__ void kv_rope_append_layers_f32_kvbf16(const float* kv, const float* k_norm,
                                                            const float* inv_freq, __nv_bfloat16* const* k_caches,
                                                            __nv_bfloat16* const* v_caches, int layers, int nkv,
                                                            int hd, const int* lens, float eps, int layer_major) {
    kv_rope_append_layers(kv, k_norm, inv_freq, k_caches, v_caches, layers, nkv, hd, lens, eps, layer_major);
}
