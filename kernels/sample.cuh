// The sampler's shared definitions: its config and row-state layouts, the CPU reference's
// arithmetic op for op (dexp, order keys, weights, the filters' membership test, normalised
// probabilities, residual leaves), the last-block ticket and the draw's tree descent. Included
// by sample.cu (the phase-per-launch sampler) and sample_topk.cu (the fused top-k sampler), so
// both compute every value with the same instructions.
#pragma once
#include "common.cuh"

#define LEAVES 2048
#define THREADS 1024
#define CAND 1024
#define CAND_MAX 2048
#define MAX_BLOCKS 512

struct SampleCfg {
    float temperature;
    uint32_t top_k;
    float top_p;
    float min_p;
    uint32_t k;         // drafts judged (rows 0..k−1); the draw is from row m ≤ k
    uint32_t pad[3];
    double u[65];       // accept uniforms u[0..k), then the draw's uniform at u[k]
};

struct SampleRow {
    float max;
    uint32_t kth;       // keep keys ≥ kth (top-k; 0 keeps all)
    uint32_t prefix;    // radix select: the key bits found so far
    uint32_t remaining; // radix select: rank still to find inside the prefix
    uint32_t cand;      // top-p candidates: keys ≥ cand
    uint32_t cut_key;   // top-p: keep key > cut_key, or key == cut_key and id ≤ cut_id
    uint32_t cut_id;
    uint32_t ncand;
    uint32_t overflow;
    uint32_t pad;
    double total_k;     // tree sum of p over the top-k set
    double total;       // tree sum of p over the kept set
};

// ---- The CPU reference's arithmetic, op for op (no contraction: every op is an _rn intrinsic).

__device__ __forceinline__ double dexp(double x) {
    if (!(x > -745.2)) return 0.0;
    const double LOG2E = __longlong_as_double(0x3ff71547652b82feull);
    const double LN2_HI = __longlong_as_double(0x3fe62e42fee00000ull);
    const double LN2_LO = __longlong_as_double(0x3dea39ef35793c76ull);
    const unsigned long long C[12] = {0x3de6124613a86d09ull, 0x3e21eed8eff8d898ull, 0x3e5ae64567f544e4ull,
                                      0x3e927e4fb7789f5cull, 0x3ec71de3a556c734ull, 0x3efa01a01a01a01aull,
                                      0x3f2a01a01a01a01aull, 0x3f56c16c16c16c17ull, 0x3f81111111111111ull,
                                      0x3fa5555555555555ull, 0x3fc5555555555555ull, 0x3fe0000000000000ull};
    double n = floor(__dadd_rn(__dmul_rn(x, LOG2E), 0.5));
    double r = __dsub_rn(__dsub_rn(x, __dmul_rn(n, LN2_HI)), __dmul_rn(n, LN2_LO));
    double p = __longlong_as_double(C[0]);
#pragma unroll
    for (int i = 1; i < 12; i++) p = __dadd_rn(__dmul_rn(p, r), __longlong_as_double(C[i]));
    p = __dadd_rn(__dmul_rn(p, r), 1.0);
    p = __dadd_rn(__dmul_rn(p, r), 1.0);
    long long e = (long long)n;
    if (e >= -1022) return __dmul_rn(p, __longlong_as_double((e + 1023) << 52));
    return __dmul_rn(__dmul_rn(p, __longlong_as_double((e + 1022 + 1023) << 52)), __longlong_as_double(1ll << 52));
}

__device__ __forceinline__ uint32_t order_key(float l) {
    if (isnan(l)) return 0u;
    uint32_t b = __float_as_uint(l);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// p_i of a logit: dexp((l − M) / T); NaN gives 0.
__device__ __forceinline__ double weight(float l, float m, float t) {
    if (isnan(l)) return 0.0;
    return dexp(__ddiv_rn(__dsub_rn((double)l, (double)m), (double)t));
}

// Whether token `id` of key `key` and weight `p` survives every filter of row state `s`.
__device__ __forceinline__ bool kept(const SampleRow& s, uint32_t key, uint32_t id, double p, float min_p) {
    if (key < s.kth) return false;
    if (key < s.cut_key || (key == s.cut_key && id > s.cut_id)) return false;
    return p >= (double)min_p;
}

// pp_i: token i's probability in row state `s`, normalised; 0 outside the kept set or the row.
__device__ __forceinline__ double normalised(const float* x, int i, int vocab, const SampleRow& s, float t, float min_p) {
    if (i >= vocab) return 0.0;
    float l = x[i];
    double p = weight(l, s.max, t);
    return kept(s, order_key(l), i, p, min_p) ? __ddiv_rn(p, s.total) : 0.0;
}

// ---- Block helpers.

// The ticket of the last block of `row` to arrive (after its partial is visible); true in
// every thread of that block. The last block resets the ticket.
__device__ __forceinline__ bool last_block(uint32_t* tickets, int row, int nblocks) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&tickets[row], 1u) == (uint32_t)nblocks - 1;
        if (last) tickets[row] = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// The draw's descent of a heap-ordered sum tree with `leaves` leaves (cpu::sample::draw): go
// left iff the left sum is > 0 and either the right one is 0 or acc + left > target; else add
// the left sum to acc and go right. Returns the leaf's index; acc is carried across calls (the
// top tree, then a leaf block's).
__device__ __forceinline__ int descend(const double* tree, int leaves, double target, double* acc) {
    int j = 1;
    while (j < leaves) {
        double l = tree[2 * j], r = tree[2 * j + 1];
        if (l > 0.0 && (r == 0.0 || __dadd_rn(*acc, l) > target)) {
            j = 2 * j;
        } else {
            *acc = __dadd_rn(*acc, l);
            j = 2 * j + 1;
        }
    }
    return j - leaves;
}

// One leaf of the draw's row: pp_i, or with `residual` the residual's — pp_i without the draft
// `skip` (one-hot q), or max(0, pp_i − q_i) (a sampled draft's row `qx` of state `qs`).
// `pp` is pp_i when the caller has it already (NAN: computed here).
__device__ __forceinline__ double leaf(const float* x, int i, int vocab, const SampleRow& s, bool residual, uint32_t skip,
                                       const float* qx, const SampleRow& qs, float t, float min_p, double pp = NAN) {
    if (isnan(pp)) pp = normalised(x, i, vocab, s, t, min_p);
    if (!residual) return pp;
    if (qx == nullptr) return (uint32_t)i == skip ? 0.0 : pp;
    return fmax(__dsub_rn(pp, normalised(qx, i, vocab, qs, t, min_p)), 0.0);
}

