// The sampler on the device: a request's transform of logits rows (temperature, top-k, top-p,
// min-p), the speculative accept/reject of a verify's rows against its drafts (one-hot, or
// drawn by the draft from its own filtered rows), and the residual or bonus draw — the same bits as the CPU reference (dspark_kernels::cpu::sample),
// which defines every sum as a pairwise tree and the exponential as a fixed polynomial exactly
// so that these kernels can reproduce it. See that file's header for the math.
//
// Layout: logits [rows, ld] f32; a row has V entries, cut into leaf blocks of LEAVES = 2048
// (block b owns ids b·2048 ..). Every kernel but `sample_cut_f32` runs grid (leaf blocks, rows)
// of 1024 threads; per-row results go to `SampleRow` in `st[row]`; a phase that needs the whole
// row is finished by the last block to arrive (an atomic ticket after a fence, as argmax.cu's
// split argmax does), which combines the blocks' partials in block order, so every result is
// independent of scheduling: counts are integers, maxima are exact, and sums follow the tree.
//
// The host launches, per verify (rows = k + 1), only the phases its filters need:
//   sample_max_f32                          M, and the row state reset
//   sample_radix_f32 × 4 (top-k on)         the k-th largest key, 8 bits a round, by counting
//   sample_tree_f32 phase 0 (top-p on)      W = tree sum over the top-k set
//   sample_radix_f32 × 4 (top-p, k large)   a candidate bound: the CAND-th largest key
//   sample_gather_f32, sample_cut_f32       the candidates, sorted; top-p's walk over them
//   sample_tree_f32 phase 1                 Σ = tree sum over the kept set
//   sample_draw_f32                         accept/reject of rows 0..k−1, then the draw
// With top-k on and at most 64, sample_topk.cu does all of this in one launch instead, with the
// same bits (this sequence is its reference). A sampled draft runs the same phases on each slot's logits row (rows = 1, k = 0), its state
// kept per slot for the verify's ratio and residual (`q_logits`, `q_st` of sample_draw_f32).
// `cfg` (device memory, written with the step's inputs so a CUDA graph replays it) holds the
// filters and the uniforms. When top-p's walk does not end inside its candidates (more than
// CAND_MAX tokens tied or needed), `out[2]` is set and the host redoes the round from the logits
// with the CPU reference, which gives the same result.
#include "sample.cuh"

// The pairwise tree of 2·THREADS leaves (thread t holds leaves 2t, 2t + 1), built in `tree`
// (2·LEAVES doubles of shared memory) in heap order: tree[1] the root, node j the sum of nodes
// 2j and 2j + 1, the leaves at tree[LEAVES + i]. Returns the root in every thread.
__device__ double block_tree(double a, double b, double* tree) {
    int t = threadIdx.x;
    __syncthreads();
    tree[LEAVES + 2 * t] = a;
    tree[LEAVES + 2 * t + 1] = b;
    tree[THREADS + t] = __dadd_rn(a, b);
    __syncthreads();
    for (int n = THREADS / 2; n >= 1; n >>= 1) {
        if (t < n) tree[n + t] = __dadd_rn(tree[2 * (n + t)], tree[2 * (n + t) + 1]);
        __syncthreads();
    }
    return tree[1];
}

// Tree sum of `n` partials (in block order, zero-padded to a power of two), in thread 0's
// result; with `heap` the top tree is kept in heap order (heap[1] root, leaves heap[np + i]);
// returns np (the padded count).
__device__ int top_tree(const double* partials, int n, double* heap, double* root) {
    int np = 1;
    while (np < n) np <<= 1;
    for (int i = threadIdx.x; i < np; i += blockDim.x) heap[np + i] = i < n ? ((volatile const double*)partials)[i] : 0.0;
    __syncthreads();
    for (int w = np / 2; w >= 1; w >>= 1) {
        for (int j = w + threadIdx.x; j < 2 * w; j += blockDim.x) heap[j] = __dadd_rn(heap[2 * j], heap[2 * j + 1]);
        __syncthreads();
    }
    *root = heap[1];
    return np;
}


// ---- Phases.

extern "C" __global__ void sample_max_f32(const float* logits, int ld, int vocab, const SampleCfg* cfg, SampleRow* st,
                                          float* part, uint32_t* tickets) {
    pdl_trigger();
    pdl_wait();
    const int b = blockIdx.x, row = blockIdx.y, nb = gridDim.x;
    const float* x = logits + (size_t)row * ld;
    float m = -INFINITY;
    for (int i = b * LEAVES + threadIdx.x; i < min(vocab, (b + 1) * LEAVES); i += THREADS) m = fmaxf(m, x[i]);
    __shared__ float red[32];
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        m = warp_max(red[threadIdx.x]);
        if (threadIdx.x == 0) part[row * nb + b] = m;
    }
    if (!last_block(tickets, row, nb)) return;
    if (threadIdx.x == 0) {
        float mm = -INFINITY;
        for (int j = 0; j < nb; j++) mm = fmaxf(mm, ((volatile float*)part)[row * nb + j]);
        SampleRow s = {};
        s.max = mm;
        s.kth = 0;
        s.cut_key = 0;
        s.cut_id = 0xffffffffu;
        s.cand = 0;
        st[row] = s;
    }
}

// One round of a radix select over the keys ≥ st.kth of each row: finds the key of rank
// `rank` (1 = the largest) 8 bits at a time from the top. mode 0: top-k (rank = top_k, every
// key eligible, result in st.kth); mode 1: the top-p candidate bound (rank = CAND among keys
// ≥ kth, result in st.cand; when the eligible set has at most CAND keys the bound is kth).
extern "C" __global__ void sample_radix_f32(const float* logits, int ld, int vocab, const SampleCfg* cfg, SampleRow* st,
                                            uint32_t* part, uint32_t* tickets, int round, int mode) {
    pdl_trigger();
    pdl_wait();
    const int b = blockIdx.x, row = blockIdx.y, nb = gridDim.x;
    const SampleRow s = st[row];
    if (mode == 1 && round > 0 && s.cand != 0xffffffffu) return;  // settled in round 0
    const int shift = 24 - 8 * round;
    const uint32_t floor_key = mode == 0 ? 0u : s.kth;
    const uint32_t prefix = round == 0 ? 0u : s.prefix;
    const uint32_t high = round == 0 ? 0u : 0xffffffffu << (shift + 8);
    __shared__ uint32_t hist[256];
    if (threadIdx.x < 256) hist[threadIdx.x] = 0;
    __syncthreads();
    const float* x = logits + (size_t)row * ld;
    // Logits crowd a few bins (their exponent bits first), so lanes of a warp that share a bin
    // add once for all of them (every lane runs every iteration, so the match is warp-wide).
    const int lane = threadIdx.x & 31, hi_i = min(vocab, (b + 1) * LEAVES);
    for (int base = b * LEAVES; base < hi_i; base += THREADS) {
        int i = base + threadIdx.x;
        uint32_t bin = 256u;  // not counted
        if (i < hi_i) {
            uint32_t key = order_key(x[i]);
            if (key >= floor_key && (key & high) == (prefix & high)) bin = (key >> shift) & 255u;
        }
        uint32_t same = __match_any_sync(0xffffffffu, bin);
        if (bin < 256u && lane == __ffs(same) - 1) atomicAdd(&hist[bin], (uint32_t)__popc(same));
    }
    __syncthreads();
    uint32_t* mine = part + ((size_t)row * nb + b) * 256;
    if (threadIdx.x < 256) mine[threadIdx.x] = hist[threadIdx.x];
    if (!last_block(tickets, row, nb)) return;
    if (threadIdx.x < 256) {
        uint32_t c = 0;
        for (int j = 0; j < nb; j++) c += ((volatile uint32_t*)part)[((size_t)row * nb + j) * 256 + threadIdx.x];
        hist[threadIdx.x] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t remaining = round == 0 ? (mode == 0 ? cfg->top_k : (uint32_t)CAND) : s.remaining;
        if (mode == 1 && round == 0) {
            uint32_t all = 0;
            for (int d = 0; d < 256; d++) all += hist[d];
            if (all <= (uint32_t)CAND) {
                st[row].cand = s.kth;
                return;
            }
        }
        uint32_t cum = 0;
        int d = 255;
        for (; d > 0; d--) {
            if (cum + hist[d] >= remaining) break;
            cum += hist[d];
        }
        uint32_t p = prefix | ((uint32_t)d << shift);
        st[row].prefix = p;
        st[row].remaining = remaining - cum;
        if (round == 3) {
            if (mode == 0) st[row].kth = p;
            else st[row].cand = p;
        } else if (mode == 1) {
            st[row].cand = 0xffffffffu;  // not settled: later rounds run
        }
    }
}

// Tree sums of p over each row: phase 0 over the top-k set (st.total_k, top-p's reference
// mass), phase 1 over the kept set (st.total).
extern "C" __global__ void sample_tree_f32(const float* logits, int ld, int vocab, const SampleCfg* cfg, SampleRow* st,
                                           double* part, uint32_t* tickets, int phase) {
    pdl_trigger();
    pdl_wait();
    const int b = blockIdx.x, row = blockIdx.y, nb = gridDim.x;
    const SampleRow s = st[row];
    const float t = cfg->temperature, min_p = cfg->min_p;
    const float* x = logits + (size_t)row * ld;
    double v[2];
    for (int h = 0; h < 2; h++) {
        int i = b * LEAVES + 2 * threadIdx.x + h;
        v[h] = 0.0;
        if (i < vocab) {
            float l = x[i];
            uint32_t key = order_key(l);
            double p = weight(l, s.max, t);
            bool in = phase == 0 ? key >= s.kth : kept(s, key, i, p, min_p);
            v[h] = in ? p : 0.0;
        }
    }
    __shared__ double tree[2 * LEAVES];
    double root = block_tree(v[0], v[1], tree);
    if (threadIdx.x == 0) part[row * nb + b] = root;
    if (!last_block(tickets, row, nb)) return;
    __shared__ double heap[2 * MAX_BLOCKS];
    double total;
    top_tree(part + row * nb, nb, heap, &total);
    if (threadIdx.x == 0) {
        if (phase == 0) st[row].total_k = total;
        else st[row].total = total;
    }
}

// The top-p candidates of each row (keys ≥ st.cand) as (key, ~id) pairs in `cands`
// [rows, CAND_MAX]; more than CAND_MAX sets the row's overflow.
extern "C" __global__ void sample_gather_f32(const float* logits, int ld, int vocab, SampleRow* st,
                                             unsigned long long* cands) {
    pdl_trigger();
    pdl_wait();
    const int b = blockIdx.x, row = blockIdx.y;
    const uint32_t cand = max(st[row].cand, st[row].kth);
    const float* x = logits + (size_t)row * ld;
    for (int i = b * LEAVES + threadIdx.x; i < min(vocab, (b + 1) * LEAVES); i += THREADS) {
        uint32_t key = order_key(x[i]);
        if (key >= cand) {
            uint32_t pos = atomicAdd(&st[row].ncand, 1u);
            if (pos < CAND_MAX) cands[(size_t)row * CAND_MAX + pos] = ((unsigned long long)key << 32) | (uint32_t)~i;
            else st[row].overflow = 1;
        }
    }
}

// Top-p's walk, one block per row: sort the candidates by (key descending, id ascending),
// weigh them, and sum in that order until the sum reaches top_p · W; the last token summed is
// the cut. A walk that runs out of candidates keeps them all when they are the whole top-k set,
// and otherwise overflows.
extern "C" __global__ void sample_cut_f32(const float* logits, int ld, const SampleCfg* cfg, SampleRow* st,
                                          const unsigned long long* cands) {
    pdl_trigger();
    pdl_wait();
    const int row = blockIdx.x;
    __shared__ unsigned long long key[CAND_MAX];
    __shared__ double w[CAND_MAX];
    const SampleRow s = st[row];
    const int n = min(s.ncand, (uint32_t)CAND_MAX);
    int np = 1;
    while (np < n) np <<= 1;
    for (int i = threadIdx.x; i < np; i += blockDim.x) key[i] = i < n ? cands[(size_t)row * CAND_MAX + i] : 0ull;
    __syncthreads();
    // Bitonic sort, descending: the largest key first and, among equal keys, the largest ~id
    // (the smallest id).
    for (int size = 2; size <= np; size <<= 1) {
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < np; i += blockDim.x) {
                int j = i ^ stride;
                if (j > i) {
                    bool desc = (i & size) == 0;
                    unsigned long long a = key[i], c = key[j];
                    if ((a < c) == desc) {
                        key[i] = c;
                        key[j] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    const float* x = logits + (size_t)row * ld;
    for (int i = threadIdx.x; i < n; i += blockDim.x) w[i] = weight(x[~(uint32_t)key[i]], s.max, cfg->temperature);
    __syncthreads();
    if (threadIdx.x != 0 || s.overflow) return;
    const double goal = __dmul_rn((double)cfg->top_p, s.total_k);
    double cum = 0.0;
    int cut = -1;
    for (int r = 0; r < n; r++) {
        cum = __dadd_rn(cum, w[r]);
        if (cum >= goal) {
            cut = r;
            break;
        }
    }
    if (cut < 0) {
        if (max(s.cand, s.kth) != s.kth || n == 0) {
            st[row].overflow = 1;
            return;
        }
        cut = n - 1;
    }
    st[row].cut_key = (uint32_t)(key[cut] >> 32);
    st[row].cut_id = ~(uint32_t)key[cut];
}

// The verify's decisions and the draw. Every block first judges drafts d_1..d_k (drafts[0..k))
// against rows 0..k−1 exactly as the CPU loop does — accept d_{i+1} iff q_i(d) > 0 and
// u_i < pp_i(d) / q_i(d), where q is one-hot (the greedy draft law, q_logits null) or the
// sampled draft's distribution: normalised(q_logits row i, its state q_st[i]), the very row the
// draft drew d_{i+1} from — which fixes the draw's row m and whether it is a residual (pp_m
// without d_{m+1}, or max(0, pp_m − q_m)) or the bonus (pp_k); a residual with no mass falls
// back to pp_m itself, as the host does. Then the tree of that row's leaves, and the last block
// descends it with u[k]. out = [m, token, overflow, row]; the token also goes to `token_out`
// when it is not null (a draft slot's draw feeding the next slot and the verify).
extern "C" __global__ void sample_draw_f32(const float* logits, int ld, int vocab, const SampleCfg* cfg,
                                           const SampleRow* st, const uint32_t* drafts, const float* q_logits,
                                           int q_ld, const SampleRow* q_st, double* part, uint32_t* tickets,
                                           uint32_t* out, uint32_t* token_out) {
    pdl_trigger();
    pdl_wait();
    const int b = blockIdx.x, nb = gridDim.x;
    const int k = cfg->k;
    const float t = cfg->temperature, min_p = cfg->min_p;
    int m = 0;
    for (; m < k; m++) {
        const uint32_t d = drafts[m];
        double pp = normalised(logits + (size_t)m * ld, d, vocab, st[m], t, min_p);
        double qd = q_logits ? normalised(q_logits + (size_t)m * q_ld, d, vocab, q_st[m], t, min_p) : 1.0;
        if (!(qd > 0.0 && (double)cfg->u[m] < __ddiv_rn(pp, qd))) break;
    }
    const int row = m;
    const bool residual = m < k;
    const uint32_t skip = residual && q_logits == nullptr ? drafts[m] : 0xffffffffu;
    const float* qx = residual && q_logits ? q_logits + (size_t)m * q_ld : nullptr;
    const SampleRow qs = qx ? q_st[m] : SampleRow{};
    const SampleRow s = st[row];
    const float* x = logits + (size_t)row * ld;
    // This block's leaves of the residual (or bonus) row, and of pp itself for the fallback:
    // they differ only in the skipped draft's block (one-hot) or anywhere (sampled q).
    double v[2], w[2];
    bool has_d = false;
    for (int h = 0; h < 2; h++) {
        int i = b * LEAVES + 2 * threadIdx.x + h;
        w[h] = normalised(x, i, vocab, s, t, min_p);
        v[h] = leaf(x, i, vocab, s, residual, skip, qx, qs, t, min_p, w[h]);
        has_d |= (uint32_t)i == skip;
    }
    const bool differs = __syncthreads_or(has_d) || qx != nullptr;
    __shared__ double leaf_tree[2 * LEAVES];
    double root = block_tree(v[0], v[1], leaf_tree);
    double* mine = part + 2 * b;
    if (threadIdx.x == 0) mine[0] = root;
    if (differs) {
        double r2 = block_tree(w[0], w[1], leaf_tree);
        if (threadIdx.x == 0) mine[1] = r2;
    } else if (threadIdx.x == 0) {
        mine[1] = root;
    }
    if (!last_block(tickets, 0, nb)) return;
    __shared__ double heap[2 * MAX_BLOCKS];
    __shared__ double part_pick[MAX_BLOCKS];
    double total;
    for (int j = threadIdx.x; j < nb; j += blockDim.x) part_pick[j] = ((volatile double*)part)[2 * j];
    __syncthreads();
    int np = top_tree(part_pick, nb, heap, &total);
    bool use_residual = residual;
    if (residual && total == 0.0) {
        use_residual = false;
        for (int j = threadIdx.x; j < nb; j += blockDim.x) part_pick[j] = ((volatile double*)part)[2 * j + 1];
        __syncthreads();
        np = top_tree(part_pick, nb, heap, &total);
    }
    const double target = __dmul_rn((double)cfg->u[k], total);
    // Descend the top tree to a leaf block (every thread walks the same path).
    double acc = 0.0;
    const int lb = descend(heap, np, target, &acc);
    __syncthreads();
    double a[2];
    for (int h = 0; h < 2; h++) {
        int i = lb * LEAVES + 2 * threadIdx.x + h;
        a[h] = leaf(x, i, vocab, s, use_residual, skip, qx, qs, t, min_p);
    }
    block_tree(a[0], a[1], leaf_tree);
    if (threadIdx.x == 0) {
        const int q = descend(leaf_tree, LEAVES, target, &acc);
        uint32_t overflow = 0;
        for (int r = 0; r <= k; r++) overflow |= st[r].overflow;
        const uint32_t token = (uint32_t)(lb * LEAVES + q);
        out[0] = m;
        out[1] = token;
        out[2] = overflow;
        out[3] = row;
        if (token_out) *token_out = token;
    }
}
