// Scaled dot-product attention with grouped-query heads over a KV cache, f32.
//
// q [rows, nh, hd]; k, v [kv_len, nkv, hd] (cache incl. the new rows); out [rows, nh·hd].
// Query head h reads kv head h / (nh / nkv). causal = 1: row r is at position first_pos + r and
// sees keys 0..=first_pos + r (target decode / verify / prefill). causal = 0: every row sees all
// kv_len keys (the DSpark draft block, bidirectional over context + block).
// Launch: one block of 4 warps per (row, head). Each warp takes every 4th key and keeps an
// online softmax (running max m, sum l, and hd/32 output values per lane); the four warps'
// states are merged through shared memory at the end. hd must be a multiple of 32, ≤ 256.
#include "common.cuh"

#define WARPS 4
#define MAXD 8  // hd / 32 values per lane, hd ≤ 256

extern "C" __global__ void attention_f32(const float* q, const float* k, const float* v, float* out, int nh, int nkv,
                                         int hd, int kv_len, int causal, int first_pos) {
    int row = blockIdx.x / nh, h = blockIdx.x % nh;
    int kvh = h / (nh / nkv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int per = hd / 32;
    float scale = rsqrtf((float)hd);
    int visible = causal ? min(first_pos + row + 1, kv_len) : kv_len;
    const float* qh = q + ((size_t)row * nh + h) * hd;
    float qv[MAXD], o[MAXD];
    for (int d = 0; d < per; d++) { qv[d] = qh[lane + 32 * d] * scale; o[d] = 0.f; }
    float m = -INFINITY, l = 0.f;
    for (int j = warp; j < visible; j += WARPS) {
        const float* kj = k + ((size_t)j * nkv + kvh) * hd;
        float s = 0.f;
        for (int d = 0; d < per; d++) s += qv[d] * kj[lane + 32 * d];
        s = warp_sum(s);
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new);  // 0 when m = -inf
        float p = expf(s - m_new);
        const float* vj = v + ((size_t)j * nkv + kvh) * hd;
        for (int d = 0; d < per; d++) o[d] = o[d] * corr + p * vj[lane + 32 * d];
        l = l * corr + p;
        m = m_new;
    }
    __shared__ float sm[WARPS], sl[WARPS], so[WARPS][256];
    if (lane == 0) { sm[warp] = m; sl[warp] = l; }
    for (int d = 0; d < per; d++) so[warp][lane + 32 * d] = o[d];
    __syncthreads();
    if (warp == 0) {
        float M = -INFINITY;
        for (int w = 0; w < WARPS; w++) M = fmaxf(M, sm[w]);
        float L = 0.f;
        float acc[MAXD];
        for (int d = 0; d < per; d++) acc[d] = 0.f;
        for (int w = 0; w < WARPS; w++) {
            if (sm[w] == -INFINITY) continue;  // this warp saw no keys
            float c = expf(sm[w] - M);
            L += sl[w] * c;
            for (int d = 0; d < per; d++) acc[d] += so[w][lane + 32 * d] * c;
        }
        float* oh = out + ((size_t)row * nh + h) * hd;
        for (int d = 0; d < per; d++) oh[lane + 32 * d] = acc[d] / L;
    }
}
