// Per-head RMSNorm followed by NeoX RoPE: Qwen3's q_norm/k_norm + rotary step.
//
// Row r sits at absolute position first_pos + r. For each head vector:
// v = v / sqrt(mean(v²) + eps) · w, then for i < hd/2 with angle = pos · inv_freq[i]:
//   v[i] ← v[i]·cos − v[i+hd/2]·sin,  v[i+hd/2] ← v[i+hd/2]·cos + v[i]·sin.
// inv_freq is precomputed on the host exactly as the CPU reference does; hd ≤ 512.
#include "common.cuh"

// Fused post-projection step of attention for a few rows: the q|k|v projection output
// qkv [rows, (nq + 2·nkv)·hd] (q heads, then k heads, then v heads) is turned into
//   q heads: RMSNorm(q_norm) + RoPE, written to q_out [rows, nq, hd];
//   k heads: RMSNorm(k_norm) + RoPE, written straight into the K cache at row first_pos + r;
//   v heads: copied into the V cache at row first_pos + r.
// first_pos = lens[0] is read from device memory (common.cuh), so a captured graph serves every
// position.
// One launch replaces two norm+rope launches and two cache copies. nq = 0 serves the draft's
// context rows, which have keys and values only. Launch: one block of hd/2 threads (rounded up
// to a warp multiple) per (row, head) with heads = nq + 2·nkv.
extern "C" __global__ void qkv_rope_append_f32(const float* qkv, const float* q_norm, const float* k_norm,
                                               const float* inv_freq, float* q_out, float* k_cache, float* v_cache,
                                               int nq, int nkv, int hd, const int* lens, float eps) {
    pdl_trigger();
    // Written by the host before the step (not by a kernel): safe to read before the wait.
    const int first_pos = lens[0], cache_row = first_pos;
    const int heads = nq + 2 * nkv;
    const int row = blockIdx.x / heads, head = blockIdx.x % heads;
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
        const float angle = (float)(first_pos + row) * inv_freq[i];
        c = cosf(angle);
        s = sinf(angle);
    }
    pdl_wait();
    float a = 0.f, b = 0.f;
    if (i < half) { a = src[i]; b = src[i + half]; }
    if (is_v) {  // v: plain copy (uniform branch per block)
        float* dst = v_cache + ((size_t)(cache_row + row) * nkv + (head - nq - nkv)) * hd;
        if (i < half) { dst[i] = a; dst[i + half] = b; }
        return;
    }
    float* dst = is_q ? q_out + ((size_t)row * nq + head) * hd
                      : k_cache + ((size_t)(cache_row + row) * nkv + (head - nq)) * hd;
    float inv = rsqrtf(block_sum(a * a + b * b) / hd + eps);
    if (i < half) {
        a = a * inv * wa;
        b = b * inv * wb;
        dst[i] = a * c - b * s;
        dst[i + half] = b * c + a * s;
    }
}
