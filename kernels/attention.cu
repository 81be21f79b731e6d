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

// ---- split-KV attention for a few query rows (decode, verify, draft block) ----------------------
//
// The kernel above gives every (row, head) its own block, so at decode (1 row) only 32 blocks
// run and each query head re-reads its KV head: the cache is streamed G = nh/nkv times by too few
// SMs. Here a block owns one KV head and one slice of the keys ("flash-decoding"). The block
// stages tiles of TK keys' K and V rows in shared memory with coalesced 16-byte loads — every
// K/V byte of the slice is read from HBM once for all queries of the group (rows × G query
// heads) — and prefetches the next tile into registers while it computes on this one. Warp w
// takes queries w, w+4, … and keeps an online softmax per query; the block writes an
// unnormalised partial (running max m, sum l, Σ p·v) per query and slice.
// `attention_combine_f32` merges the slices in a fixed order: M = max m_s,
// L = Σ l_s·e^(m_s−M), out = Σ o_s·e^(m_s−M) / L.
// Layout of the partials: o [splits, rows, nh, hd], ml [splits, rows, nh, 2].
// PER = hd / 32 values per lane; the query capacity is SPLIT_WARPS · maxq(PER).

#define SPLIT_WARPS 4
#define TK 16

template <int PER>
__device__ void attention_split(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                float* part_o, float* part_ml, int rows, int nh, int nkv, int kv_len, int causal,
                                int first_pos) {
    constexpr int HD = PER * 32, V4 = HD / 4;            // float4 per K row
    constexpr int MAXQ = PER <= 4 ? 8 : 4;               // queries per warp
    constexpr int LOADS = (TK * V4) / (SPLIT_WARPS * 32);  // float4 of K (and of V) per thread per tile
    __shared__ float4 sk[TK * V4], sv[TK * V4];
    const int kvh = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int G = nh / nkv, Q = rows * G;
    const int chunk = (kv_len + splits - 1) / splits;
    const int j0 = split * chunk, j1 = min(kv_len, j0 + chunk);
    const float scale = rsqrtf((float)HD);

    float qv[MAXQ][PER], o[MAXQ][PER], m[MAXQ], l[MAXQ];
    int vis[MAXQ];
#pragma unroll
    for (int i = 0; i < MAXQ; i++) {
        int qi = warp + SPLIT_WARPS * i;
        int r = qi / G, h = kvh * G + qi % G;
        m[i] = -INFINITY;
        l[i] = 0.f;
        vis[i] = qi < Q ? (causal ? min(first_pos + r + 1, kv_len) : kv_len) : 0;
#pragma unroll
        for (int d = 0; d < PER; d++) {
            o[i][d] = 0.f;
            qv[i][d] = qi < Q ? q[((size_t)r * nh + h) * HD + lane + 32 * d] * scale : 0.f;
        }
    }

    float4 pk[LOADS], pv[LOADS];
    auto fetch = [&](int t0) {
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            int idx = threadIdx.x + i * SPLIT_WARPS * 32;
            int key = t0 + idx / V4, c = idx % V4;
            if (key < j1) {
                size_t off = ((size_t)key * nkv + kvh) * V4 + c;
                pk[i] = reinterpret_cast<const float4*>(k)[off];
                pv[i] = reinterpret_cast<const float4*>(v)[off];
            } else {
                pk[i] = make_float4(0.f, 0.f, 0.f, 0.f);
                pv[i] = pk[i];
            }
        }
    };
    if (j0 < j1) fetch(j0);
    for (int t0 = j0; t0 < j1; t0 += TK) {
        __syncthreads();  // the previous tile is no longer read
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            sk[threadIdx.x + i * SPLIT_WARPS * 32] = pk[i];
            sv[threadIdx.x + i * SPLIT_WARPS * 32] = pv[i];
        }
        __syncthreads();
        if (t0 + TK < j1) fetch(t0 + TK);  // in flight while this tile is computed
        const int n = min(TK, j1 - t0);
        for (int jj = 0; jj < n; jj++) {
            const float* kr = reinterpret_cast<const float*>(sk + jj * V4);
            const float* vr = reinterpret_cast<const float*>(sv + jj * V4);
            const int j = t0 + jj;
#pragma unroll
            for (int i = 0; i < MAXQ; i++) {
                if (j < vis[i]) {  // uniform across the warp
                    float s = 0.f;
#pragma unroll
                    for (int d = 0; d < PER; d++) s += qv[i][d] * kr[lane + 32 * d];
                    s = warp_sum(s);
                    float m_new = fmaxf(m[i], s);
                    float corr = expf(m[i] - m_new);
                    float p = expf(s - m_new);
#pragma unroll
                    for (int d = 0; d < PER; d++) o[i][d] = o[i][d] * corr + p * vr[lane + 32 * d];
                    l[i] = l[i] * corr + p;
                    m[i] = m_new;
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < MAXQ; i++) {
        int qi = warp + SPLIT_WARPS * i;
        if (qi >= Q) continue;
        int r = qi / G, h = kvh * G + qi % G;
        size_t slot = ((size_t)split * rows + r) * nh + h;
#pragma unroll
        for (int d = 0; d < PER; d++) part_o[slot * HD + lane + 32 * d] = o[i][d];
        if (lane == 0) {
            part_ml[slot * 2] = m[i];
            part_ml[slot * 2 + 1] = l[i];
        }
    }
}

#define SPLIT_KERNEL(PER, NAME)                                                                                     \
    extern "C" __global__ void __launch_bounds__(SPLIT_WARPS * 32)                                                  \
        NAME(const float* q, const float* k, const float* v, float* part_o, float* part_ml, int rows, int nh,       \
             int nkv, int kv_len, int causal, int first_pos) {                                                      \
        attention_split<PER>(q, k, v, part_o, part_ml, rows, nh, nkv, kv_len, causal, first_pos);                  \
    }
SPLIT_KERNEL(1, attention_split_hd32_f32)
SPLIT_KERNEL(2, attention_split_hd64_f32)
SPLIT_KERNEL(4, attention_split_hd128_f32)
SPLIT_KERNEL(8, attention_split_hd256_f32)

// One block of hd threads per (row, head).
extern "C" __global__ void attention_combine_f32(const float* part_o, const float* part_ml, float* out, int rows,
                                                 int nh, int hd, int splits) {
    const int rh = blockIdx.x, d = threadIdx.x;
    const size_t stride = (size_t)rows * nh;
    float M = -INFINITY;
    for (int s = 0; s < splits; s++) M = fmaxf(M, part_ml[(s * stride + rh) * 2]);
    float L = 0.f, acc = 0.f;
    for (int s = 0; s < splits; s++) {
        float ms = part_ml[(s * stride + rh) * 2];
        if (ms == -INFINITY) continue;  // this slice saw no visible key
        float c = expf(ms - M);
        L += part_ml[(s * stride + rh) * 2 + 1] * c;
        if (d < hd) acc += part_o[(s * stride + rh) * hd + d] * c;
    }
    if (d < hd) out[(size_t)rh * hd + d] = acc / L;
}
