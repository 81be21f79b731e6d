// Scaled dot-product attention with grouped-query heads over a KV cache, f32.
//
// q [rows, nh, hd]; k, v [kv_len, nkv, hd] (cache incl. the new rows); out [rows, nh·hd].
// Query head h reads kv head h / (nh / nkv); first_pos = lens[0] and kv_len = lens[1] are read
// from device memory (common.cuh). causal = 1: row r is at position first_pos + r and
// sees keys 0..=first_pos + r (target decode / verify / prefill). causal = 0: every row sees all
// kv_len keys (the DSpark draft block, bidirectional over context + block).
// Launch: one block of 4 warps per (row, head). Each warp takes every 4th key and keeps an
// online softmax (running max m, sum l, and hd/32 output values per lane); the four warps'
// states are merged through shared memory at the end. hd must be a multiple of 32, ≤ 256.
#include "norm_rope.cuh"

#define WARPS 4
#define MAXD 8  // hd / 32 values per lane, hd ≤ 256

// E: the cache element (float, or __nv_bfloat16 for `attention_f32_kvbf16`), widened by load_w.
template <typename E>
__device__ void attention_head(const float* q, const E* k, const E* v, float* out, int nh, int nkv, int hd,
                               const int* lens, int causal) {
    const int first_pos = lens[0], kv_len = lens[1];
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
        const E* kj = k + ((size_t)j * nkv + kvh) * hd;
        float s = 0.f;
        for (int d = 0; d < per; d++) s += qv[d] * load_w(kj, lane + 32 * d);
        s = warp_sum(s);
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new);  // 0 when m = -inf
        float p = expf(s - m_new);
        const E* vj = v + ((size_t)j * nkv + kvh) * hd;
        for (int d = 0; d < per; d++) o[d] = o[d] * corr + p * load_w(vj, lane + 32 * d);
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
extern "C" __global__ void attention_f32(const float* q, const float* k, const float* v, float* out, int nh, int nkv,
                                         int hd, const int* lens, int causal) {
    attention_head(q, k, v, out, nh, nkv, hd, lens, causal);
}
extern "C" __global__ void attention_f32_kvbf16(const float* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                                                float* out, int nh, int nkv, int hd, const int* lens, int causal) {
    attention_head(q, k, v, out, nh, nkv, hd, lens, causal);
}

// ---- split-KV attention for a few query rows (decode, verify, draft block) ----------------------
//
// The kernel above gives every (row, head) its own block, so at decode (1 row) only 32 blocks
// run and each query head re-reads its KV head: the cache is streamed G = nh/nkv times by too few
// SMs. Here a block owns one KV head, one slice of the keys ("flash-decoding") and up to 4 of
// the group's queries (rows × G query heads; one decode row of Qwen3's G = 4 is one block per
// KV head and slice). The block stages tiles of 32 keys' K and V rows in shared memory with
// coalesced 16-byte loads, the next tile's loads in flight while it computes on this one (the
// first tile by cp.async straight into shared memory, so the first two are in flight at once).
// A slice's tiles interleave with the other slices' at a stride fixed for the kernel and GPU
// (common.cuh split_block_at), so a row's bits do not depend on the step's length.
//
// Warp w takes keys 8w .. 8w + 7 of each tile for all four queries, so the block reads each K
// and V element from shared memory once. (Earlier each warp took one query and all 32 keys, so
// every warp read the whole tile: four times the shared-memory reads. This layout measured 1–3%
// faster alone at 512 and 4096 keys, decode ±0 there and −0.7–0.8% / −1.4–1.5% at 8192 / 16384
// keys, where the tiles per block are many, in two calls; measured, git history of docs/perf.md.)
// Scores: lane (query i = lane / 8, key k = lane % 8) takes the whole dot product q_i · k_k
// (K rows padded by one float4, so the eight rows a quarter-warp reads start in distinct banks;
// Q rows too). The query's max and sum over the warp's eight keys are three shuffles each in
// its lane group. P·V: lane d owns output dims hd/32·d … of all four queries, reads each key's
// V as one vector and takes the eight keys' p from shared memory four at a time. Each warp keeps
// an online softmax per query across tiles; at the end the four warps' states are merged in a
// fixed order (warp 0 first) and the block writes an unnormalised partial (running max m, sum
// l, Σ p·v) per query and slice, merged by `attention_combine_f32` in a fixed order:
// M = max m_s, L = Σ l_s·e^(m_s−M), out = Σ o_s·e^(m_s−M) / L.
// Layout of the partials: o [splits, rows, nh, hd], ml [splits, rows, nh, 2].

#define SPLIT_WARPS 4
// A tracing hook like attention_tc.cu's TC_MARK, for a harness that includes this file to
// time-stamp each block's phases: start, after the PDL wait, q staged, the first tile in shared
// memory, its scores, its softmax, the last tile's P·V, the end; `dep` is a value the mark must
// wait for (the phase's result). In the engine it is nothing.
#ifndef Q1_MARK
#define Q1_MARK(i, dep)
#endif
#define TK 32  // keys per tile
static_assert(TK == SPLIT_TILE, "a slice's tiles are split_block_at's");

// A lane's PER consecutive floats of a shared-memory row (PER·lane …), in vector reads.
template <int PER>
__device__ __forceinline__ void load_row(const float* row, int lane, float (&out)[PER]) {
    if constexpr (PER % 4 == 0) {
#pragma unroll
        for (int c = 0; c < PER / 4; c++) {
            const float4 t = reinterpret_cast<const float4*>(row + PER * lane)[c];
            out[4 * c] = t.x; out[4 * c + 1] = t.y; out[4 * c + 2] = t.z; out[4 * c + 3] = t.w;
        }
    } else {
        static_assert(PER % 2 == 0, "head_dim a multiple of 64");
#pragma unroll
        for (int c = 0; c < PER / 2; c++) {
            const float2 t = reinterpret_cast<const float2*>(row + PER * lane)[c];
            out[2 * c] = t.x; out[2 * c + 1] = t.y;
        }
    }
}

// SPLIT_Q = 4 queries per block (one decode row: G = 4 queries per KV head). More queries per KV
// head (verify, the draft block) go to the tensor-core kernel in attention_tc.cu, which measured
// faster there (docs/perf.md).
// E is the cache element (common.cuh KvElem): float, or __nv_bfloat16 for half the bytes per
// key. The tiles are widened to f32 as they are put in shared memory, so the math below is the
// same for both. cp.async cannot widen, so a bf16 first tile lands raw in the V tile's room (its
// 16 KB hold a bf16 K and V tile) and is widened in place after a barrier; held in a second set
// of registers instead, it spilled (128 registers).
//
// ROPE (the `attention_split_rope_*` kernels): qkv_rope_append folded in (norm_rope.cuh). q is
// then the raw q|k|v output; warp w normalises and rotates its own query as it stages it, and
// in the block whose slice holds the step's new row w (rows ≤ 4) it also appends that row's key
// and value to the caches and writes them into the tile after the tile has landed (the tile's
// own loads of the row read the cache before it was written; those values are overwritten).
// The caches are then written through rp while k and v read them: only rows whose loaded
// values are discarded are both written and read.
template <int PER, typename E = float, bool ROPE = false>
__device__ void attention_split(const float* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v,
                                float* part_o, float* part_ml, int rows, int nh, int nkv, const int* lens,
                                int causal, int stride, RopeIn<E> rp = {}) {
    using KE = KvElem<E>;
    using Chunk = typename KE::Chunk;
    constexpr bool F32 = KE::PER_CHUNK == 4;
    constexpr int HD = PER * 32, D4 = HD / 4;
    constexpr int DC = HD / KE::PER_CHUNK;                     // 16-byte chunks per cache row
    constexpr int SPLIT_Q = SPLIT_WARPS;                       // queries per block
    constexpr int KW = TK / SPLIT_WARPS;                       // keys per warp and tile (8)
    static_assert(KW * SPLIT_Q == 32, "a lane per (query, key) of its warp");
    constexpr int LOADS = (TK * DC) / (SPLIT_WARPS * 32);      // chunks of K (and of V) per thread per tile
    __shared__ float4 sq[SPLIT_Q][D4 + 1];
    __shared__ float4 sk[TK][D4 + 1];
    __shared__ float sv[TK][HD];
    __shared__ float4 sp[SPLIT_WARPS][SPLIT_Q * KW / 4];  // each warp's p of a tile, by query
    pdl_trigger();
    Q1_MARK(0, 0.f);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int first_pos = lens[0], kv_len = lens[1];  // host-written: safe before the wait
    const SplitBlock sb = split_block(rows, nh, nkv, kv_len, stride, SPLIT_Q);
    if (!sb.active) return;
    const int Q = sb.Q, kvh = sb.kvh, q0 = sb.q0, j0 = sb.j0, step = sb.step;
    const float scale = rsqrtf((float)HD);

    // The first tile goes straight to shared memory with cp.async (no registers held) and the
    // second into the registers below, so both tiles' loads are in flight from the start: at
    // 4096 keys a block has two tiles, and the second used to wait a whole round trip for the
    // first to land before it was asked for. Cache rows below first_pos were written by earlier
    // steps, which had completed before this step's positions were copied to the device (every
    // step starts with that stream copy, ARCHITECTURE.md): a tile of such rows only may be
    // asked for before the PDL wait, while the kernels before this one still run. The step's own
    // rows are appended by the kernel just before this one.
    // Each thread's K/V addresses from one base pointer (common.cuh TileRows; per-load index
    // arithmetic measured 5.44 / 18.0 µs against 5.25 / 17.75 at 512 / 4096 keys in a
    // stand-alone harness).
    constexpr int KSTEP = SPLIT_WARPS * 32 / DC;  // keys between one thread's loads of a tile
    const TileRowsT<Chunk> tr = tile_rows<SPLIT_WARPS * 32, DC, Chunk>(k, v, nkv, kvh);
    const int key0 = tr.key0;
    const size_t rs = tr.row;
    const Chunk *kb = tr.k, *vb = tr.v;
    uint4* raw = reinterpret_cast<uint4*>(&sv[0][0]);  // bf16: the first tile, K then V, unwidened
    auto first_tile = [&]() {
        const int rem = kv_len - j0 - key0;  // load n is in the step's keys while KSTEP·n < rem
        const size_t o = (size_t)j0 * rs;
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            const int idx = threadIdx.x + i * SPLIT_WARPS * 32;
            const bool in = i * KSTEP < rem;
            const size_t off = in ? o + i * KSTEP * rs : 0;
            if constexpr (F32) {
                cp_async16(&sk[idx / D4][idx % D4], kb + off, in);
                cp_async16(reinterpret_cast<float4*>(&sv[idx / D4][0]) + idx % D4, vb + off, in);
            } else {
                cp_async16(raw + idx, kb + off, in);
                cp_async16(raw + TK * DC + idx, vb + off, in);
            }
        }
        cp_async_commit();
    };
    const bool early = j0 + TK <= first_pos;
    if (early) first_tile();

    // ROPE: the rows' rotations (by the whole block), the norm weights of the warp's query and of
    // the new row the warp appends (its slice holds the row's tile), all before the wait.
    const int new_pos = first_pos + warp;
    const bool appends = ROPE && warp < rows && (new_pos / TK) % stride == sb.split;
    __shared__ float2 srot[ROPE ? SPLIT_Q * HD / 2 : 1];  // the rows' rotations (rows ≤ SPLIT_Q)
    float qw[PER];
    FoldRow<PER, E> nr;
    if constexpr (ROPE) {
        block_rotations(srot, rp.inv_freq, first_pos, min(rows, SPLIT_Q), HD / 2);
        if (q0 + warp < Q) warp_norm_weights<PER>(rp.q_norm, qw);
        if (appends) nr.setup(rp);
        __syncthreads();
    }

    // This lane's query and key in its warp's part of a tile, the keys that query sees, and its
    // online softmax (the same in the query's eight lanes); Σ p·v of every query for this lane's
    // dims PER·lane ….
    const int kq = lane / KW, kk = lane % KW;
    const int vis = q0 + kq < Q ? (causal ? min(first_pos + sb.row(q0 + kq) + 1, kv_len) : kv_len) : 0;
    float mq = -INFINITY, lq = 0.f;
    float o[SPLIT_Q][PER];
#pragma unroll
    for (int i = 0; i < SPLIT_Q; i++)
#pragma unroll
        for (int e = 0; e < PER; e++) o[i][e] = 0.f;

    Chunk pk[LOADS], pv[LOADS];
    auto fetch = [&](int t0) {
        const int rem = kv_len - t0 - key0;
        const size_t o = (size_t)t0 * rs;
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            if (i * KSTEP < rem) {
                pk[i] = kb[o + i * KSTEP * rs];
                pv[i] = vb[o + i * KSTEP * rs];
            } else {
                pk[i] = KE::zero();
                pv[i] = pk[i];
            }
        }
    };
    // A tile from registers into shared memory (f32: chunk = float4 column; bf16: a chunk is two
    // float4 columns once widened).
    auto store_tile = [&](const Chunk* ck, const Chunk* cv) {
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            int idx = threadIdx.x + i * SPLIT_WARPS * 32;
            if constexpr (F32) {
                sk[idx / D4][idx % D4] = ck[i];
                reinterpret_cast<float4*>(&sv[idx / D4][0])[idx % D4] = cv[i];
            } else {
                const int key = idx / DC, c = 2 * (idx % DC);
                float4* vrow = reinterpret_cast<float4*>(&sv[key][0]);
                KE::widen(ck[i], sk[key][c], sk[key][c + 1]);
                KE::widen(cv[i], vrow[c], vrow[c + 1]);
            }
        }
    };
    // (Asking for the second tile before the wait too measured no better: docs/perf.md.)
    pdl_wait();
    Q1_MARK(1, 0.f);
    // q is the previous kernel's output: read after the wait, through L2 (__ldcg, common.cuh),
    // before the second tile's loads are asked for. (In a cold launch alone at 4096 keys q still
    // lands ~12 µs into ~19, behind the first tiles' loads issued before the wait, with or
    // without this order (measured; git history of docs/perf.md). Behind a q|k|v projection, as
    // in the engine, those loads are issued while the projection ends.)
    constexpr int QL = (SPLIT_Q * D4 + SPLIT_WARPS * 32 - 1) / (SPLIT_WARPS * 32);  // float4s per thread
    float x[ROPE ? PER : 1];
    float4 qv[ROPE ? 1 : QL];
    const int qw_i = q0 + warp;  // ROPE: the query this warp stages
    if constexpr (ROPE) {
        if (qw_i < Q) warp_load_head<PER>(q, sb.row(qw_i), sb.head(qw_i), nh + 2 * nkv, x);
        if (appends) nr.load(rp, warp, nh, nkv, kvh);
    } else {
#pragma unroll
        for (int u = 0; u < QL; u++) {
            const int i = threadIdx.x + u * SPLIT_WARPS * 32, qi = q0 + i / D4;
            qv[u] = make_float4(0.f, 0.f, 0.f, 0.f);
            const float4* head = reinterpret_cast<const float4*>(q + ((size_t)sb.row(qi) * nh + sb.head(qi)) * HD);
            if (i < SPLIT_Q * D4 && qi < Q) qv[u] = __ldcg(head + i % D4);
        }
    }
    if (!early) first_tile();
    if (j0 + step < kv_len) fetch(j0 + step);

    if constexpr (ROPE) {
        float* sqw = reinterpret_cast<float*>(&sq[warp][0]);
        if (qw_i < Q) warp_norm_rope<PER>(x, qw, srot + sb.row(qw_i) * (HD / 2), rp.eps);
#pragma unroll
        for (int e = 0; e < PER; e++) sqw[lane + 32 * e] = qw_i < Q ? x[e] * scale : 0.f;
        if (appends) nr.append(rp, new_pos, nkv, kvh, srot + warp * (HD / 2));
    } else {
#pragma unroll
        for (int u = 0; u < QL; u++) {
            const int i = threadIdx.x + u * SPLIT_WARPS * 32;
            if (i < SPLIT_Q * D4) {
                float4 val = qv[u];
                val.x *= scale; val.y *= scale; val.z *= scale; val.w *= scale;
                sq[i / D4][i % D4] = val;
            }
        }
    }
    Q1_MARK(2, 0.f);
    for (int t0 = j0; t0 < kv_len; t0 += step) {
        if (t0 == j0) {
            cp_async_wait_all();  // this thread's part of the first tile has landed
            if constexpr (!F32) {  // widen it in place: every thread reads its raw chunks first
                Chunk ck[LOADS], cv[LOADS];
#pragma unroll
                for (int i = 0; i < LOADS; i++) {
                    ck[i] = raw[threadIdx.x + i * SPLIT_WARPS * 32];
                    cv[i] = raw[TK * DC + threadIdx.x + i * SPLIT_WARPS * 32];
                }
                __syncthreads();
                store_tile(ck, cv);
            }
        } else {
            __syncthreads();  // the previous tile is no longer being read
            store_tile(pk, pv);
        }
        __syncthreads();  // the tile (and, the first time, sq) is in place for every warp
        if constexpr (ROPE) {
            // The step's new rows in this tile replace what the tile's loads found in the cache
            // (a condition uniform over the block, so the barrier is too).
            if (max(t0, first_pos) < min(min(t0 + TK, kv_len), first_pos + rows)) {
                if (appends && new_pos >= t0 && new_pos < t0 + TK) {
                    float* kr = reinterpret_cast<float*>(&sk[new_pos - t0][0]);
#pragma unroll
                    for (int e = 0; e < PER; e++) {
                        kr[lane + 32 * e] = nr.k[e];
                        sv[new_pos - t0][lane + 32 * e] = nr.v[e];
                    }
                }
                __syncthreads();
            }
        }
        if (t0 == j0) Q1_MARK(3, 0.f);
        if (t0 != j0 && t0 + step < kv_len) fetch(t0 + step);  // in flight while this tile is computed
        const int n = min(TK, kv_len - t0);                     // the tile's keys in the step
        if (warp * KW >= n) continue;                   // none of this warp's keys (the last tile)
        const int jl = warp * KW + kk;
        // The score of (query kq, key jl): each K element read serves four lanes' queries.
        float s = 0.f;
#pragma unroll 8
        for (int c = 0; c < D4; c++) {
            const float4 kv4 = sk[jl][c], qq = sq[kq][c];
            s += qq.x * kv4.x + qq.y * kv4.y + qq.z * kv4.z + qq.w * kv4.w;
        }
        if (t0 == j0) Q1_MARK(4, s);
        const bool valid = jl < n && t0 + jl < vis;
        s = valid ? s : -INFINITY;
        const float m_new = fmaxf(mq, group_max<KW>(s));
        const float mu = m_new == -INFINITY ? 0.f : m_new;  // this query has seen no key yet: p = 0
        const float p = valid ? expf(s - mu) : 0.f;
        const float corr = expf(mq - mu);
        lq = lq * corr + group_sum<KW>(p);
        mq = m_new;
        reinterpret_cast<float*>(&sp[warp][0])[lane] = p;
        __syncwarp();
        if (t0 == j0) Q1_MARK(5, p);
        // Σ p·v over the warp's keys: each V element read once for all four queries.
#pragma unroll
        for (int i = 0; i < SPLIT_Q; i++) {
            const float ci = __shfl_sync(0xffffffffu, corr, KW * i);
#pragma unroll
            for (int e = 0; e < PER; e++) o[i][e] *= ci;
        }
        const int nk = min(KW, n - warp * KW);
#pragma unroll
        for (int c = 0; c < KW / 4; c++) {
            float4 p4[SPLIT_Q];  // the four queries' p of keys 4c .. 4c + 3
#pragma unroll
            for (int i = 0; i < SPLIT_Q; i++) p4[i] = sp[warp][i * (KW / 4) + c];
#pragma unroll
            for (int k4 = 0; k4 < 4; k4++) {
                if (4 * c + k4 >= nk) break;  // past the step's keys: zero-filled rows, p = 0
                float vv[PER];
                load_row<PER>(&sv[warp * KW + 4 * c + k4][0], lane, vv);
#pragma unroll
                for (int i = 0; i < SPLIT_Q; i++) {
                    const float w = k4 == 0 ? p4[i].x : k4 == 1 ? p4[i].y : k4 == 2 ? p4[i].z : p4[i].w;
#pragma unroll
                    for (int e = 0; e < PER; e++) o[i][e] += w * vv[e];
                }
            }
        }
        __syncwarp();  // this tile's p are read before the next tile's overwrite them
        if (t0 + step >= kv_len) Q1_MARK(6, o[0][0]);
    }
    // The four warps' states of each query, merged in a fixed order (warp 0 first) by the warp
    // of that query; the K tile's room holds them once every warp is done with the last tile.
    __shared__ float2 sml[SPLIT_WARPS][SPLIT_Q];
    __syncthreads();
    float* so = reinterpret_cast<float*>(&sk[0][0]);  // [warp][query][HD]
    static_assert(sizeof(sk) >= sizeof(float) * SPLIT_WARPS * SPLIT_Q * HD, "the states fit the K tile");
#pragma unroll
    for (int i = 0; i < SPLIT_Q; i++)
#pragma unroll
        for (int e = 0; e < PER; e++) so[(warp * SPLIT_Q + i) * HD + PER * lane + e] = o[i][e];
    if (kk == 0) sml[warp][kq] = make_float2(mq, lq);
    __syncthreads();
    const int qi = q0 + warp;
    if (qi < Q) {
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < SPLIT_WARPS; w++) M = fmaxf(M, sml[w][warp].x);
        float L = 0.f, acc[PER];
#pragma unroll
        for (int e = 0; e < PER; e++) acc[e] = 0.f;
#pragma unroll
        for (int w = 0; w < SPLIT_WARPS; w++) {
            const float2 ml = sml[w][warp];
            const float c = ml.x == -INFINITY ? 0.f : expf(ml.x - M);  // a warp that saw no key
            L += ml.y * c;
#pragma unroll
            for (int e = 0; e < PER; e++) acc[e] += so[(w * SPLIT_Q + warp) * HD + PER * lane + e] * c;
        }
        const size_t slot = sb.slot(qi, rows, nh);
#pragma unroll
        for (int e = 0; e < PER; e++) part_o[slot * HD + PER * lane + e] = acc[e];
        if (lane == 0) {
            part_ml[slot * 2] = M;
            part_ml[slot * 2 + 1] = L;
        }
    }
    Q1_MARK(7, 0.f);
}

// E: the cache element: f32 caches, or bf16 ones (`_kvbf16`, `--kv-cache bf16`).
#define SPLIT_KERNEL_E(PER, E, NAME)                                                                                \
    extern "C" __global__ void __launch_bounds__(SPLIT_WARPS * 32, 4)                                               \
        NAME(const float* q, const E* k, const E* v, float* part_o, float* part_ml, int rows, int nh, int nkv,       \
             const int* lens, int causal, int stride) {                                                             \
        attention_split<PER, E>(q, k, v, part_o, part_ml, rows, nh, nkv, lens, causal, stride);                     \
    }
#define SPLIT_KERNEL(PER, NAME) SPLIT_KERNEL_E(PER, float, NAME)
SPLIT_KERNEL(2, attention_split_q1_hd64_f32)
SPLIT_KERNEL(4, attention_split_q1_hd128_f32)
SPLIT_KERNEL_E(2, __nv_bfloat16, attention_split_q1_hd64_f32_kvbf16)
SPLIT_KERNEL_E(4, __nv_bfloat16, attention_split_q1_hd128_f32_kvbf16)

// The same with qkv_rope_append folded in (ROPE above): qkv is the raw q|k|v output, k and v the
// whole caches, read and appended to.
#define SPLIT_ROPE_KERNEL(PER, E, NAME)                                                                            \
    extern "C" __global__ void __launch_bounds__(SPLIT_WARPS * 32, 4)                                               \
        NAME(const float* qkv, const float* q_norm, const float* k_norm, const float* inv_freq, E* k, E* v,         \
             float* part_o, float* part_ml, int rows, int nh, int nkv, const int* lens, int causal, int stride,     \
             float eps) {                                                                                          \
        attention_split<PER, E, true>(qkv, k, v, part_o, part_ml, rows, nh, nkv, lens, causal, stride,             \
                                                RopeIn<E>{qkv, q_norm, k_norm, inv_freq, k, v, eps});              \
    }
SPLIT_ROPE_KERNEL(2, float, attention_split_rope_q1_hd64_f32)
SPLIT_ROPE_KERNEL(4, float, attention_split_rope_q1_hd128_f32)
SPLIT_ROPE_KERNEL(2, __nv_bfloat16, attention_split_rope_q1_hd64_f32_kvbf16)
SPLIT_ROPE_KERNEL(4, __nv_bfloat16, attention_split_rope_q1_hd128_f32_kvbf16)

// One block of 4·hd threads per (row, head); splits ≤ 128, counted as the attention kernel counts
// them (split_count over lens[1] keys). The slice weights e^(m_s−M) are
// computed once into shared memory; then four thread groups each sum every 4th slice for their
// dim (independent loads, a quarter of the serial chain) and the four sums are added in a fixed
// order.
// EARLY (the decode's PDL twin): three L2 round trips in series — lens[1] after the wait, the
// slices' (m, l), the partials behind the weights' barrier — become one. The slice count is read
// before the wait (the host writes `lens`, as the attention kernels assume), and every thread
// requests its group's first COMBINE_EARLY slices of partials while warp 0 requests the (m, l).
// 20 a group covers 80 slices (a decode launch on 132 SMs has up to 66) in 60 registers (sm_90;
// 32 took 94, which would keep o's first blocks off an SM the combine holds); slices past them
// follow one at a time. Measured (H100, one call, two rounds, docs/perf.md): decode −1.0% bf16 /
// −0.6% FP8 at 4,096 keys, ±0.5% at 512; the same form in every combine also gave FP8 verify
// +0.7% (bf16 verify −0.3%), so the verify's, the draft block's and the segmented combines keep
// the batched loop. Both add the same products slice by slice in the same order: the same bits.
// The body is a device function shared by the kernels below (`attention_combine_f32`, its
// twin `attention_combine_q1_f32`, which the decode launches with PDL, and the segmented one).
// out_bf16: out holds bf16 rows for an `_x1h` consumer (o_proj with bf16 activations), each
// value rounded as an `_x1` consumer rounds it.
#define COMBINE_GROUPS 4
#define COMBINE_BATCH 16
#define COMBINE_EARLY 20
template <bool EARLY>
__device__ void attention_combine(const float* part_o, const float* part_ml, float* out, int rows, int nh, int hd,
                                  const int* lens, int keys, int max_splits, int rh, int out_bf16) {
    pdl_trigger();
    if constexpr (!EARLY) pdl_wait();
    const int splits = split_count(lens[1], keys, max_splits);
    if constexpr (EARLY) pdl_wait();
    __shared__ float sw[128];
    __shared__ float sL;
    __shared__ float sacc[COMBINE_GROUPS][256];
    const int d = threadIdx.x % hd, grp = threadIdx.x / hd;
    const size_t stride = (size_t)rows * nh;
    // EARLY: this thread's partials, slices grp, grp + 4, … (the first COMBINE_EARLY of them).
    float pe[EARLY ? COMBINE_EARLY : 1];
    if constexpr (EARLY) {
#pragma unroll
        for (int j = 0; j < COMBINE_EARLY; j++) {
            const int sp = grp + j * COMBINE_GROUPS;
            pe[j] = sp < splits ? part_o[(sp * stride + rh) * hd + d] : 0.f;
        }
    }
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        float ms[4], ls[4];
        float M = -INFINITY;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int sp = lane + 32 * i;
            ms[i] = sp < splits ? part_ml[(sp * stride + rh) * 2] : -INFINITY;
            ls[i] = sp < splits ? part_ml[(sp * stride + rh) * 2 + 1] : 0.f;
            M = fmaxf(M, ms[i]);
        }
        M = warp_max(M);
        float L = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            // A slice that saw no visible key has m = −inf and weight 0.
            float wgt = ms[i] == -INFINITY ? 0.f : expf(ms[i] - M);
            sw[lane + 32 * i] = wgt;
            L += ls[i] * wgt;
        }
        L = warp_sum(L);
        if (lane == 0) sL = L;
    }
    __syncthreads();
    float acc = 0.f;
    if constexpr (EARLY) {
#pragma unroll
        for (int j = 0; j < COMBINE_EARLY; j++) {
            const int sp = grp + j * COMBINE_GROUPS;
            if (sp < splits) acc += pe[j] * sw[sp];
        }
        for (int sp = grp + COMBINE_EARLY * COMBINE_GROUPS; sp < splits; sp += COMBINE_GROUPS)
            acc += part_o[(sp * stride + rh) * hd + d] * sw[sp];
    } else {
        // A group's slices' partials requested COMBINE_BATCH at once (one round trip up to 64
        // slices), then added in slice order. Written as one loop over the slices (`#pragma
        // unroll 8`), a group's last splits / 4 mod 8 slices — all of them at 512 keys — were a
        // remainder loop of one L2 round trip each, in series (sm_90 SASS).
        for (int sp0 = grp; sp0 < splits; sp0 += COMBINE_BATCH * COMBINE_GROUPS) {
            float pv[COMBINE_BATCH], pw[COMBINE_BATCH];
#pragma unroll
            for (int j = 0; j < COMBINE_BATCH; j++) {
                const int sp = sp0 + j * COMBINE_GROUPS;
                pv[j] = sp < splits ? part_o[(sp * stride + rh) * hd + d] : 0.f;
                pw[j] = sp < splits ? sw[sp] : 0.f;
            }
#pragma unroll
            for (int j = 0; j < COMBINE_BATCH; j++)
                if (sp0 + j * COMBINE_GROUPS < splits) acc += pv[j] * pw[j];
        }
    }
    sacc[grp][d] = acc;
    __syncthreads();
    if (grp == 0) {
        float total = ((sacc[0][d] + sacc[1][d]) + sacc[2][d]) + sacc[3][d];
        if (out_bf16) {
            reinterpret_cast<__nv_bfloat16*>(out)[(size_t)rh * hd + d] = __float2bfloat16_rn(total / sL);
        } else {
            out[(size_t)rh * hd + d] = total / sL;
        }
    }
}
extern "C" __global__ void attention_combine_f32(const float* part_o, const float* part_ml, float* out, int rows,
                                                 int nh, int hd, const int* lens, int keys, int max_splits,
                                                 int out_bf16) {
    attention_combine<false>(part_o, part_ml, out, rows, nh, hd, lens, keys, max_splits, blockIdx.x, out_bf16);
}
// The same merge in its EARLY form (above), after the decode kernel (one query row), under its own
// name so the host launches it with PDL: that measured decode −0.7% at 512 keys and ±0 at 4096,
// while the combine after the tensor-core kernel (verify, draft block) stays without it
// (cuda/mod.rs NO_PDL).
extern "C" __global__ void attention_combine_q1_f32(const float* part_o, const float* part_ml, float* out, int rows,
                                                    int nh, int hd, const int* lens, int keys, int max_splits,
                                                    int out_bf16) {
    attention_combine<true>(part_o, part_ml, out, rows, nh, hd, lens, keys, max_splits, blockIdx.x, out_bf16);
}
// The segmented twin (attention_tc.cu `attention_tc_seg_*`): blockIdx.z the sequence, x its
// (row, head), blocks past its rows leave; each sequence's partials merged with its own slice
// count, as its own combine would.
extern "C" __global__ void attention_combine_seg_f32(const AttnSeg* segs, int nh, int hd, int keys, int out_bf16) {
    const AttnSeg sg = segs[blockIdx.z];
    if ((int)blockIdx.x >= sg.rows * nh) return;
    attention_combine<false>(sg.part_o, sg.part_ml, sg.out, sg.rows, nh, hd, sg.lens, keys, sg.splits, blockIdx.x, out_bf16);
}
