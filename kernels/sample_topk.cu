// The fused top-k sampler: sample.cu's whole sequence — max, top-k's k-th key, top-p's mass
// and cut, the kept mass, the accept/reject of the drafts and the draw — in one launch, for
// requests whose top-k is on and at most TOPK_MAX (Qwen's 20, the usual 40 or 50). The same
// bits as sample.cu (and so as the CPU reference), because once top-k is on every later step
// reads only the top-k set, which is small enough for one block to hold:
//
// * Each leaf block (2048 ids) finds its own k-th largest key by radix select in shared memory
//   and writes its ids with keys at or above it, in id order. The row's k-th key K* is at or
//   above every block's own, so the union of these lists holds every id with key ≥ K*; its
//   k-th largest key is K*.
// * The last block of the row (atomic ticket) selects K* over the union, keeps the top-k set
//   (ids in order), weighs it and sums it. Every sum of sample.cu is a pairwise tree over the
//   whole padded row in which every id outside the set contributes an exact 0.0, and x + 0.0 =
//   x, so a tree node with an empty side passes the other side's sum through unchanged. The
//   tree restricted to the set is therefore the Cartesian tree of the sorted ids split at their
//   highest differing bit — built here in one pass with a stack — and its sums and the draw's
//   descent (left iff the left sum is > 0 and the right is 0 or acc + left > target) are the
//   full tree's, addition for addition.
// * The last row to finish (a second ticket, at tickets[rows]) judges the drafts and draws from
//   the accepted row's residual or bonus over that row's kept ids.
//
// Layout: grid (leaf blocks, rows) of 1024 threads. `lists` holds LOCAL_WORDS u64 per (row,
// block): word 0 the count, then (key << 32 | id) entries; `kept` holds each row's top-k set
// (CAND_MAX u64 per row, ids in order, count in the row state's ncand). A block whose own
// boundary is tied more than LOCAL_MAX times, or a top-k set over KEPT_MAX, sets the row's
// overflow and the host redoes the round from the logits, as with sample.cu.
#include "sample.cuh"

#define TOPK_MAX 64
#define LOCAL_WORDS 128
#define LOCAL_MAX (LOCAL_WORDS - 1)
#define KEPT_MAX 512
#define UNION_CACHE 3072  // union entries the last block holds in shared memory (else: L2)
#define NO_SPLIT 64  // the boundary "bit" after the last id: above every real one

// Block-wide exclusive prefix sum of one count per thread (blockDim.x = THREADS); the block's
// total in *total, in every thread.
__device__ int block_scan(int v, int* total) {
    __shared__ int warp_base[32];
    __shared__ int sum;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();  // the previous call's readers are done with warp_base and sum
    if (lane == 31) warp_base[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int w = warp_base[lane], s = w;
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        warp_base[lane] = s - w;
        if (lane == 31) sum = s;
    }
    __syncthreads();
    *total = sum;
    return warp_base[warp] + x - v;
}

// Warp 0: one radix-select round's digit — the bin, from 255 down, in which the count of keys
// above reaches *remaining — folded into *prefix, and the rank left inside it into *remaining,
// exactly as sample_radix_f32's serial walk picks it. hist has 256 bins.
__device__ void radix_pick(const uint32_t* hist, int shift, uint32_t* prefix, uint32_t* remaining) {
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    uint32_t c[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        c[j] = hist[255 - 8 * lane - j];
        sum += c[j];
    }
    uint32_t incl = sum;
    for (int o = 1; o < 32; o <<= 1) {
        uint32_t y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    const uint32_t rem = *remaining;
    const unsigned hit = __ballot_sync(0xffffffffu, incl >= rem);
    const int first = hit ? __ffs(hit) - 1 : 31;
    __syncwarp();  // every lane has read *remaining before one lane writes it
    if (lane == first) {
        uint32_t cum = incl - sum;
        int j = 0;
        for (; j < 7; j++) {
            if (cum + c[j] >= rem) break;
            cum += c[j];
        }
        *prefix |= (uint32_t)(255 - 8 * lane - j) << shift;
        *remaining = rem - cum;
    }
}

// One histogram round's count of `key` (bin 256: not counted) into hist; every lane of the warp
// calls it the same number of times (lanes sharing a bin add once, as in sample_radix_f32).
__device__ __forceinline__ void count_bin(uint32_t* hist, uint32_t bin) {
    const uint32_t same = __match_any_sync(0xffffffffu, bin);
    if (bin < 256u && (threadIdx.x & 31) == __ffs(same) - 1) atomicAdd(&hist[bin], (uint32_t)__popc(same));
}

// The logit whose order key is `key` (order_key's inverse; a NaN's key 0 gives a NaN, whose
// weight is 0 like any NaN's): the set's weights need no second read of the logits.
__device__ __forceinline__ float key_value(uint32_t key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// The pairwise tree of n values at sorted ids (nsum[0..n) the values, vid the ids), as the
// Cartesian tree of their highest differing bits: internal node n + j has children lc[j],
// rc[j] and sum nsum[n + j] (left + right). Thread 0 only. Returns the root (n > 0).
struct SparseTree {
    double nsum[2 * KEPT_MAX];
    uint16_t lc[KEPT_MAX], rc[KEPT_MAX];
    uint16_t stack[KEPT_MAX];
    uint8_t split[KEPT_MAX];
};

__device__ int sparse_build(SparseTree& tr, const uint32_t* vid, int n) {
    int sp = 0, next = n;
    for (int j = 0; j < n; j++) {
        int cur = j;
        const int b = j + 1 < n ? 31 - __clz(vid[j] ^ vid[j + 1]) : NO_SPLIT;
        // Groups split below b lie inside the subtree this boundary divides: merge them first.
        while (sp > 0 && tr.split[sp - 1] < b) {
            const int u = next++, l = tr.stack[--sp];
            tr.lc[u - n] = (uint16_t)l;
            tr.rc[u - n] = (uint16_t)cur;
            tr.nsum[u] = __dadd_rn(tr.nsum[l], tr.nsum[cur]);
            cur = u;
        }
        tr.stack[sp] = (uint16_t)cur;
        tr.split[sp] = (uint8_t)b;
        sp++;
    }
    return tr.stack[0];
}

// New leaf values under the same tree: the internal sums again, children before parents (the
// order sparse_build made them). Thread 0 only. Returns the root's sum.
__device__ double sparse_resum(SparseTree& tr, int n) {
    for (int j = 0; j + 1 < n; j++) tr.nsum[n + j] = __dadd_rn(tr.nsum[tr.lc[j]], tr.nsum[tr.rc[j]]);
    return tr.nsum[n > 1 ? 2 * n - 2 : 0];
}

// The draw's descent of a sparse tree (sample.cuh's `descend`, at the nodes where both sides
// hold ids); returns the leaf.
__device__ int sparse_descend(const SparseTree& tr, int root, int n, double target) {
    double acc = 0.0;
    int j = root;
    while (j >= n) {
        const int l = tr.lc[j - n], r = tr.rc[j - n];
        const double lv = tr.nsum[l], rv = tr.nsum[r];
        if (lv > 0.0 && (rv == 0.0 || __dadd_rn(acc, lv) > target)) {
            j = l;
        } else {
            acc = __dadd_rn(acc, lv);
            j = r;
        }
    }
    return j;
}

// A row state written by another block of this launch, read past L1.
__device__ __forceinline__ SampleRow load_row(const SampleRow* p) {
    SampleRow s;
    const unsigned int* src = (const unsigned int*)p;
    unsigned int* dst = (unsigned int*)&s;
#pragma unroll
    for (int i = 0; i < (int)(sizeof(SampleRow) / 4); i++) dst[i] = __ldcg(src + i);
    return s;
}

// The draw's leaves over one row's kept ids, zeros dropped, ids in order: values in tr.nsum,
// ids in vid; returns their count and the tree's total in *total (thread 0).
__device__ int draw_leaves(SparseTree& tr, uint32_t* vid, const unsigned long long* ids, int n, const float* x,
                           int vocab, const SampleRow& s, bool residual, uint32_t skip, const float* qx,
                           const SampleRow& qs, float t, float min_p, int* root, double* total) {
    double v = 0.0;
    uint32_t id = 0;
    if ((int)threadIdx.x < n) {
        id = (uint32_t)__ldcg(ids + threadIdx.x);
        v = leaf(x, id, vocab, s, residual, skip, qx, qs, t, min_p);
    }
    int nn;
    const int pos = block_scan(v > 0.0 ? 1 : 0, &nn);
    if (v > 0.0) {
        tr.nsum[pos] = v;
        vid[pos] = id;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        *root = nn > 0 ? sparse_build(tr, vid, nn) : 0;
        *total = nn > 0 ? tr.nsum[*root] : 0.0;
    }
    return nn;
}

extern "C" __global__ void __launch_bounds__(THREADS)
    sample_topk_f32(const float* logits, int ld, int vocab, const SampleCfg* cfg, SampleRow* st, const uint32_t* drafts,
                    const float* q_logits, int q_ld, const SampleRow* q_st, float* part, unsigned long long* lists,
                    unsigned long long* kept_ids, uint32_t* tickets, uint32_t* out, uint32_t* token_out) {
    pdl_trigger();
    pdl_wait();
    const int b = blockIdx.x, row = blockIdx.y, nb = gridDim.x, rows = gridDim.y, tid = threadIdx.x;
    const float t = cfg->temperature, min_p = cfg->min_p;
    const uint32_t top_k = cfg->top_k;
    const float* x = logits + (size_t)row * ld;
    __shared__ uint32_t hist[256];
    __shared__ uint32_t sel_prefix, sel_remaining;

    // ---- Every block: its maximum (sample_max_f32's grouping) and its own top-k list.
    const int lo = b * LEAVES, hi = min(vocab, lo + LEAVES);
    uint32_t key[2];
    bool valid[2];
    float m = -INFINITY;
    for (int h = 0; h < 2; h++) {
        const int i = lo + tid + h * THREADS;
        valid[h] = i < hi;
        const float l = valid[h] ? x[i] : 0.0f;
        if (valid[h]) m = fmaxf(m, l);
        key[h] = order_key(l);
    }
    {
        __shared__ float red[32];
        m = warp_max(m);
        if ((tid & 31) == 0) red[tid >> 5] = m;
        __syncthreads();
        if (tid < 32) {
            m = warp_max(red[tid]);
            if (tid == 0) part[row * nb + b] = m;
        }
    }
    uint32_t kth = 0;  // a block of at most top_k ids keeps them all
    if ((uint32_t)(hi - lo) > top_k) {
        if (tid == 0) {
            sel_prefix = 0;
            sel_remaining = top_k;
        }
        for (int round = 0; round < 4; round++) {
            const int shift = 24 - 8 * round;
            const uint32_t high = round == 0 ? 0u : 0xffffffffu << (shift + 8);
            if (tid < 256) hist[tid] = 0;
            __syncthreads();
            const uint32_t prefix = sel_prefix;
            for (int h = 0; h < 2; h++)
                count_bin(hist, valid[h] && (key[h] & high) == (prefix & high) ? (key[h] >> shift) & 255u : 256u);
            __syncthreads();
            radix_pick(hist, shift, &sel_prefix, &sel_remaining);
            __syncthreads();
        }
        kth = sel_prefix;
    }
    unsigned long long* mine = lists + ((size_t)row * nb + b) * LOCAL_WORDS;
    int count = 0;
    for (int h = 0; h < 2; h++) {
        const bool in = valid[h] && key[h] >= kth;
        int n;
        const int pos = block_scan(in ? 1 : 0, &n);
        if (in && count + pos < LOCAL_MAX)
            mine[1 + count + pos] = ((unsigned long long)key[h] << 32) | (uint32_t)(lo + tid + h * THREADS);
        count += n;
    }
    if (tid == 0) mine[0] = (unsigned long long)count;  // above LOCAL_MAX: overflowed
    __threadfence();  // every thread's entries, before the ticket says the list is complete
    if (!last_block(tickets, row, nb)) return;

    // ---- The row's last block: K* over the union, the top-k set, top-p's cut, the kept mass.
    __shared__ int off[MAX_BLOCKS + 1];
    __shared__ uint32_t ids[KEPT_MAX], keys[KEPT_MAX], vid[KEPT_MAX];
    __shared__ double w[KEPT_MAX];
    // The union's entries, read once from L2 while the select and the compaction need them; the
    // trees and top-p's sort reuse the space after.
    __shared__ union {
        unsigned long long cache[UNION_CACHE];
        struct {
            SparseTree tr;
            double ws[KEPT_MAX];
            unsigned long long sk[KEPT_MAX];
        } late;
    } sm;
    SparseTree& tr = sm.late.tr;
    double* ws = sm.late.ws;
    unsigned long long* sk = sm.late.sk;
    __shared__ SampleRow s;
    __shared__ int overflow;
    __shared__ double mass;
    int c = 0;
    // The row's maximum over the blocks' (a tree of fmaxf instead of sample_max_f32's walk:
    // no maximum is NaN, and a zero's sign cannot change a weight, (l − M) / T).
    float bm = -INFINITY;
    if (tid < nb) {
        c = (int)__ldcg(lists + ((size_t)row * nb + tid) * LOCAL_WORDS);
        bm = __ldcg(part + row * nb + tid);
    }
    __shared__ float red[32];
    bm = warp_max(bm);
    if ((tid & 31) == 0) red[tid >> 5] = bm;
    int total;
    const int base = block_scan(c, &total);  // its barriers publish red
    const bool wide = __syncthreads_or(c > LOCAL_MAX);
    if (tid < nb) off[tid] = base;
    if (tid < 32) {
        bm = warp_max(red[tid]);
    }
    if (tid == 0) {
        off[nb] = total;
        s = SampleRow{};
        s.max = bm;
        s.cut_key = 0;
        s.cut_id = 0xffffffffu;
        overflow = wide;
        sel_prefix = 0;
        sel_remaining = top_k;
    }
    __syncthreads();
    // The union's u-th entry (u < total): block j's entry u - off[j], j the last with off[j] ≤ u.
    auto entry = [&](int u) -> unsigned long long {
        int a = 0, z = nb;
        while (z - a > 1) {
            const int mid = (a + z) / 2;
            if (off[mid] <= u) a = mid;
            else z = mid;
        }
        return __ldcg(lists + ((size_t)row * nb + a) * LOCAL_WORDS + 1 + (u - off[a]));
    };
    const bool cached = total <= UNION_CACHE;
    if (cached && !overflow) {
        for (int u = tid; u < total; u += THREADS) sm.cache[u] = entry(u);
        __syncthreads();
    }
    auto get = [&](int u) -> unsigned long long { return cached ? sm.cache[u] : entry(u); };
    int n = 0;
    if (!overflow) {
        for (int round = 0; round < 4; round++) {
            const int shift = 24 - 8 * round;
            const uint32_t high = round == 0 ? 0u : 0xffffffffu << (shift + 8);
            if (tid < 256) hist[tid] = 0;
            __syncthreads();
            const uint32_t prefix = sel_prefix;
            for (int u0 = 0; u0 < total; u0 += THREADS) {
                const int u = u0 + tid;
                uint32_t bin = 256u;
                if (u < total) {
                    const uint32_t k = (uint32_t)(get(u) >> 32);
                    if ((k & high) == (prefix & high)) bin = (k >> shift) & 255u;
                }
                count_bin(hist, bin);
            }
            __syncthreads();
            radix_pick(hist, shift, &sel_prefix, &sel_remaining);
            __syncthreads();
        }
        const uint32_t kstar = sel_prefix;
        // The top-k set in id order (the union is in id order: blocks ascending, each list too).
        for (int u0 = 0; u0 < total; u0 += THREADS) {
            const int u = u0 + tid;
            const unsigned long long e = u < total ? get(u) : 0ull;
            const bool in = u < total && (uint32_t)(e >> 32) >= kstar;
            int got;
            const int pos = block_scan(in ? 1 : 0, &got);
            if (in && n + pos < KEPT_MAX) {
                ids[n + pos] = (uint32_t)e;
                keys[n + pos] = (uint32_t)(e >> 32);
            }
            n += got;
        }
        __syncthreads();
        if (n > KEPT_MAX) {
            if (tid == 0) overflow = 1;
        } else {
            for (int j = tid; j < n; j += THREADS) w[j] = weight(key_value(keys[j]), s.max, t);
            for (int j = tid; j < n; j += THREADS) {
                tr.nsum[j] = w[j];
                vid[j] = ids[j];
            }
            __syncthreads();
            // The set's tree, built once: W is its sum over the weights, Σ and the bonus draw
            // re-sum it with other leaves (an id whose leaf is 0 passes the other side through).
            if (tid == 0) {
                s.kth = kstar;
                s.total_k = tr.nsum[sparse_build(tr, vid, n)];
            }
            __syncthreads();
            if (cfg->top_p < 1.0f) {
                // top-p's walk in (key descending, id ascending) order, to top_p · W.
                int np = 1;
                while (np < n) np <<= 1;
                for (int j = tid; j < np; j += THREADS)
                    sk[j] = j < n ? ((unsigned long long)keys[j] << 32) | (uint32_t)~ids[j] : 0ull;
                __syncthreads();
                for (int size = 2; size <= np; size <<= 1) {
                    for (int stride = size / 2; stride > 0; stride >>= 1) {
                        for (int i = tid; i < np; i += THREADS) {
                            const int j = i ^ stride;
                            if (j > i) {
                                const bool desc = (i & size) == 0;
                                const unsigned long long a = sk[i], cc = sk[j];
                                if ((a < cc) == desc) {
                                    sk[i] = cc;
                                    sk[j] = a;
                                }
                            }
                        }
                        __syncthreads();
                    }
                }
                for (int j = tid; j < n; j += THREADS) ws[j] = weight(key_value((uint32_t)(sk[j] >> 32)), s.max, t);
                __syncthreads();
                if (tid == 0) {
                    const double goal = __dmul_rn((double)cfg->top_p, s.total_k);
                    double cum = 0.0;
                    int cut = n - 1;  // the walk ran out: the whole top-k set is kept
                    for (int r = 0; r < n; r++) {
                        cum = __dadd_rn(cum, ws[r]);
                        if (cum >= goal) {
                            cut = r;
                            break;
                        }
                    }
                    s.cut_key = (uint32_t)(sk[cut] >> 32);
                    s.cut_id = ~(uint32_t)sk[cut];
                }
                __syncthreads();
            }
            // The kept mass Σ over the set (its ids are kept ones or contribute 0).
            for (int j = tid; j < n; j += THREADS) tr.nsum[j] = kept(s, keys[j], ids[j], w[j], min_p) ? w[j] : 0.0;
            __syncthreads();
            if (tid == 0) {
                s.total = sparse_resum(tr, n);
                s.ncand = n;
            }
            for (int j = tid; j < n; j += THREADS)
                kept_ids[(size_t)row * CAND_MAX + j] = ((unsigned long long)keys[j] << 32) | ids[j];
        }
    }
    __syncthreads();
    if (tid == 0) {
        s.overflow = overflow;
        st[row] = s;
    }
    __threadfence();
    if (!last_block(tickets, rows, rows)) return;

    // ---- The last row's last block: the drafts judged, then the draw (sample_draw_f32's rule).
    // Each draft's decision in its own thread (the same arithmetic as the loop of
    // sample_draw_f32); the first rejection is the pick.
    __shared__ int pick;
    __shared__ uint8_t accepts[64];  // k ≤ 64 (SampleCfg holds 65 uniforms)
    const int k = cfg->k;
    bool ov = false;
    if (tid <= k) {
        const SampleRow sr = load_row(st + tid);
        ov = sr.overflow != 0;
        if (tid < k && !ov) {
            const uint32_t d = drafts[tid];
            const double pp = normalised(logits + (size_t)tid * ld, d, vocab, sr, t, min_p);
            const double qd = q_logits ? normalised(q_logits + (size_t)tid * q_ld, d, vocab, q_st[tid], t, min_p) : 1.0;
            accepts[tid] = qd > 0.0 && (double)cfg->u[tid] < __ddiv_rn(pp, qd);
        }
    }
    const bool any_overflow = __syncthreads_or(ov);
    if (tid == 0) {
        int mm = 0;
        while (!any_overflow && mm < k && accepts[mm]) mm++;
        pick = mm;
    }
    __syncthreads();
    const int mrow = pick;
    if (any_overflow) {
        if (tid == 0) {
            out[0] = 0;
            out[1] = 0;
            out[2] = 1;
            out[3] = 0;
            if (token_out) *token_out = 0;  // a valid id for the next slot's gather; redone on the host
        }
        return;
    }
    const bool residual = mrow < k;
    const uint32_t skip = residual && q_logits == nullptr ? drafts[mrow] : 0xffffffffu;
    const float* qx = residual && q_logits ? q_logits + (size_t)mrow * q_ld : nullptr;
    const SampleRow qs = qx ? q_st[mrow] : SampleRow{};
    if (!residual && mrow == row) {
        // The bonus from this block's own row: its tree is still here, leaves p' = p / Σ on the
        // kept ids and 0 elsewhere (normalised()'s values: w is each id's weight).
        const int n = s.ncand;
        for (int j = tid; j < n; j += THREADS)
            tr.nsum[j] = kept(s, keys[j], ids[j], w[j], min_p) ? __ddiv_rn(w[j], s.total) : 0.0;
        __syncthreads();
        if (tid == 0) {
            const double target = __dmul_rn((double)cfg->u[k], sparse_resum(tr, n));
            const uint32_t token = vid[sparse_descend(tr, n > 1 ? 2 * n - 2 : 0, n, target)];
            out[0] = mrow;
            out[1] = token;
            out[2] = 0;
            out[3] = mrow;
            if (token_out) *token_out = token;
        }
        return;
    }
    const SampleRow rs = load_row(st + mrow);
    const float* xr = logits + (size_t)mrow * ld;
    const unsigned long long* rids = kept_ids + (size_t)mrow * CAND_MAX;
    __shared__ int root;
    int nn = draw_leaves(tr, vid, rids, rs.ncand, xr, vocab, rs, residual, skip, qx, qs, t, min_p, &root, &mass);
    __syncthreads();
    if (residual && mass == 0.0) {
        // The residual has no mass: the draw falls back to p' itself, as the host does.
        nn = draw_leaves(tr, vid, rids, rs.ncand, xr, vocab, rs, false, skip, qx, qs, t, min_p, &root, &mass);
        __syncthreads();
    }
    if (tid == 0) {
        const double target = __dmul_rn((double)cfg->u[k], mass);
        const uint32_t token = vid[sparse_descend(tr, root, nn, target)];
        out[0] = mrow;
        out[1] = token;
        out[2] = 0;
        out[3] = mrow;
        if (token_out) *token_out = token;
    }
}
