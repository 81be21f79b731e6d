// Split-KV attention for several query rows on the tensor cores (verify, draft block), f32.
//
// Same contract as attention_split in attention.cu: q [rows, nh, hd]; K, V caches [kv_len, nkv,
// hd]; a block owns one KV head, one slice of the keys and up to 32 of the group's queries
// (rows × G query heads, G = nh / nkv); it writes one unnormalised partial per query and slice —
// running max m, sum l, Σ p·v — that attention_combine_f32 merges in a fixed order. Causal rows
// sit at first_pos + r and see keys 0..=first_pos + r; causal = 0 lets every row see all keys.
//
// Why a second kernel: with 8 verify rows a KV head has 32 queries, and the lane-per-key f32 kernel
// spends ~1.5 instructions per query·key product on shared-memory reads, shuffles and FMAs — at
// 4096 keys that was 1.9 ms of a 7.6 ms verify, compute-bound, not HBM-bound. Here both products,
// S = Q·Kᵀ and O = P·V, run as mma.m16n8k8 in TF32 with the 3xTF32 split: each f32 operand
// x = big + small (big = x rounded to TF32, small = the f32 remainder, see split_tf32) and
// a·b ≈ big·big + big·small + small·big, which drops only the small·small term (~2⁻²² relative),
// so results stay within the 1e-5 tests against the f32 CPU reference. (small is handed to the
// MMA untruncated and the tensor cores drop its low bits, which costs about one more bit; see
// split_tf32.)
//
// Layout. A first version gave each of 4 warps 16 queries × 16 keys and the whole chain (split
// Q, S, softmax, P·V): with one warp per SM quarter that chain was latency-bound and no faster
// than the f32 kernel at 512 keys. Now a block of 8 warps works a 32-key tile in three short
// phases separated by barriers, each spread over all warps:
// 1. S = Q·Kᵀ: warp w takes m-tile w & 1 and keys 8·(w >> 1) .. +8; the scores go to shared memory.
// 2. Online softmax: warp w owns rows 4w .. 4w+3, lane = key (one max and one sum reduction per
//    row); P overwrites S, and each row's rescale factor e^(m_old − m_new) is stored beside it.
// 3. O = O·corr + P·V: warp w takes m-tile w & 1 and a quarter of hd, over all 32 keys.
// No warp shares a row's state with another, so nothing is merged at the end: the softmax warps
// write m and l, the P·V warps Σ p·v. Q is scaled by 1/√hd and split into TF32 parts once per
// block; K/V tiles are staged with coalesced 16-byte loads (the first tile's loads overlap Q's).
// Shared memory is ~68 KB at hd = 128 (dynamic; the host raises the kernel's limit at load).

// Fragment mapping (m16n8k8 .tf32: A a0 = [g][t], a1 = [g+8][t], a2 = [g][t+4], a3 = [g+8][t+4];
// B b0 = [t][g], b1 = [t+4][g]; C c0, c1 = [g][2t, 2t+1], c2, c3 = [g+8][2t, 2t+1]; g = lane / 4,
// t = lane % 4). The k-slot order inside an mma is free as long as A and B agree, so:
// - S: a 16-dim chunk is two k8 steps; slot t / t+4 of step s is dim 4t + 2s / 4t + 2s + 1, so a
//   lane reads one float4 of its Q row and one of its key's K row per chunk.
// - P·V: slot t / t+4 is key 8s + 2t / 8s + 2t + 1 of k8 step s, so a lane's two P values of a
//   row are adjacent and its two V rows share the swizzle below.
// Shared-memory rows are XOR-swizzled (K and Q: float4 column ^ 4·(row & 1); V: float column ^
// 8·((key / 2) & 3)) so that each of these fragment reads is free of bank conflicts.
#include "common.cuh"

#define TC_WARPS 8
// A tracing hook: a harness that includes this file may define it to time-stamp the phases of
// each block (start, after the PDL wait, Q staged, the first tile in shared memory, its S, its
// softmax, the last tile's P·V, the end). In the engine it is nothing.
#ifndef TC_MARK
#define TC_MARK(i)
#endif
#define TC_TK 32  // keys per tile
static_assert(TC_TK == SPLIT_TILE, "a slice's tiles are split_block_at's");
#define TC_Q 32   // queries per block: 2 m-tiles of 16
#define TC_SP (TC_TK + 1)  // row stride of the score/P tile (padded against bank conflicts)

// x = big + small: big is x rounded to TF32 (to nearest, ties away from zero, as cvt.rna does:
// add half a TF32 ulp to the bit pattern, then clear the 13 low mantissa bits; a carry moves into
// the exponent as it should), small the exact f32 remainder. small goes to the tensor cores as
// it is: a .tf32 operand's 13 low bits are not read, so the MMA sees small truncated to TF32 —
// the same trick as CUTLASS's and Triton's 3xTF32. cvt.rna.tf32.f32 has no instruction on
// sm_90: it compiled to 4–5 integer and compare instructions, twice per split, and the splits
// were a third of this kernel's instructions (measured; git history of docs/perf.md).
__device__ __forceinline__ void split_tf32(float x, uint32_t& big, uint32_t& small) {
    big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    small = __float_as_uint(x - __uint_as_float(big));
}

// x rounded to TF32 (split_tf32's big part alone).
__device__ __forceinline__ uint32_t tf32_big(float x) { return (__float_as_uint(x) + 0x1000u) & 0xffffe000u; }

__device__ __forceinline__ void mma_tf32(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One 3xTF32 product of a split A fragment (ab, as) and a split B fragment (bb, bs): the big·big
// term into `big`, the two cross terms into `small` (kept apart so the small terms are not
// rounded against the large running sum).
__device__ __forceinline__ void mma_3xtf32(float* big, float* small, const uint32_t* ab, const uint32_t* as,
                                           const uint32_t* bb, const uint32_t* bs) {
    mma_tf32(small, ab[0], ab[1], ab[2], ab[3], bs[0], bs[1]);
    mma_tf32(small, as[0], as[1], as[2], as[3], bb[0], bb[1]);
    mma_tf32(big, ab[0], ab[1], ab[2], ab[3], bb[0], bb[1]);
}

// The 2xTF32 product for a B operand that is exactly TF32 (a bf16 cache's K or V): its small
// part is zero, so a·b = big·b + small·b, two MMAs instead of three and no split of b.
__device__ __forceinline__ void mma_2xtf32(float* big, float* small, const uint32_t* ab, const uint32_t* as,
                                           const uint32_t* b) {
    mma_tf32(small, as[0], as[1], as[2], as[3], b[0], b[1]);
    mma_tf32(big, ab[0], ab[1], ab[2], ab[3], b[0], b[1]);
}

// E is the cache element (common.cuh KvElem): float, or __nv_bfloat16 for half the bytes per key.
// Tiles are widened to f32 as they are put in shared memory; bf16 values are exact TF32 numbers,
// so K and V then skip their splits and one MMA of three in both products (mma_2xtf32), and the
// results equal the f32 kernel's on a cache holding the same (bf16-rounded) values to within
// the dropped small·small term.
// LP (`attention_tc1_*`, the bf16-activation mode's kernels, `Gpu::attention_1xtf32`): one TF32
// MMA a product — Q, P and an f32 cache's K and V rounded to TF32 (~2⁻¹¹ relative, where bf16
// engines round them to bf16, 2⁻⁸), no small parts split or multiplied. Every step of the mode
// (decode, verify, a batched step's segments) takes these kernels, so a row's bits still do not
// depend on its step.
template <int PER, typename E = float, bool LP = false>
__device__ void attention_tc(const float* __restrict__ q, const E* __restrict__ k, const E* __restrict__ v,
                             float* part_o, float* part_ml, int rows, int nh, int nkv, const int* lens, int causal,
                             int stride, unsigned bx, unsigned by) {
    using KE = KvElem<E>;
    using Chunk = typename KE::Chunk;
    constexpr bool F32 = KE::PER_CHUNK == 4, EXACT = KE::exact_tf32;
    constexpr int HD = PER * 32, D4 = HD / 4, CHUNKS = HD / 16;
    constexpr int DC = HD / KE::PER_CHUNK;  // 16-byte chunks per cache row
    constexpr int NQ = HD / 32;  // n-tiles of 8 dims per warp in P·V (a quarter of hd)
    constexpr int LOADS = (TC_TK * DC) / (TC_WARPS * 32);  // chunks of K (and of V) per thread per tile
    extern __shared__ float4 dyn_smem[];
    // Q big and small parts in fragment order: [m-tile][chunk][k8 step][lane] holds lane's A
    // fragment {a0, a1, a2, a3} of that MMA, so the S loop loads it with one 16-byte read straight
    // into the four consecutive registers the MMA takes (a row-major Q needed two reads and four
    // register moves per fragment). Same size as Q: 2 · CHUNKS · 2 · 32 = TC_Q · D4 uint4.
    uint4(*sqb)[CHUNKS][2][32] = reinterpret_cast<uint4(*)[CHUNKS][2][32]>(dyn_smem);
    uint4(*sqs)[CHUNKS][2][32] = reinterpret_cast<uint4(*)[CHUNKS][2][32]>(dyn_smem + TC_Q * D4);
    float4(*sk)[D4] = reinterpret_cast<float4(*)[D4]>(dyn_smem + 2 * TC_Q * D4);  // K tile
    float(*sv)[HD] = reinterpret_cast<float(*)[HD]>(dyn_smem + (2 * TC_Q + TC_TK) * D4);  // V tile
    float(*sp)[TC_SP] = reinterpret_cast<float(*)[TC_SP]>(dyn_smem + (2 * TC_Q + 2 * TC_TK) * D4);  // S, then P
    float* scorr = &sp[TC_Q][0];  // per row: this tile's rescale of O
    pdl_trigger();
    TC_MARK(0);

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int first_pos = lens[0], kv_len = lens[1];  // host-written: safe before the wait
    const SplitBlock sb = split_block_at(rows, nh, nkv, kv_len, stride, TC_Q, bx, by);
    if (!sb.active) return;
    const int Q = sb.Q, kvh = sb.kvh, q0 = sb.q0, j0 = sb.j0, step = sb.step;
    const float scale = rsqrtf((float)HD);
    auto slot_of = [&](int qi) { return sb.slot(qi, rows, nh); };

    // The first tile's K/V loads go out before Q is staged, so the two latencies overlap.
    // Each thread's K/V addresses from one base pointer (common.cuh TileRows). The loads bypass
    // L1 (__ldcg): written plainly, they compiled to read-only-path loads, and the kernel took
    // 25.6 µs at 4096 keys against 24.1 µs this way (in a stand-alone harness).
    constexpr int KSTEP = TC_WARPS * 32 / DC;  // keys between one thread's loads of a tile
    const TileRowsT<Chunk> tr = tile_rows<TC_WARPS * 32, DC, Chunk>(k, v, nkv, kvh);
    const int key0 = tr.key0;
    const size_t rs = tr.row;
    const Chunk *kb = tr.k, *vb = tr.v;
    // Loads past the step's last key are skipped and leave the registers as they were: zeros
    // before the first fetch, else the previous tile's (finite) cache rows. Such keys are masked
    // (S = −inf, p = 0), so their K is never used and their V only as 0 · v = 0. Zeroing them on
    // every tile, and each load's address from its key by a 64-bit multiply, took 28 more
    // instructions per warp and tile (SASS: 93 IMAD against 65) and 0.1–0.3 µs at 512–1024 keys
    // (in a stand-alone harness, same outputs; ±0 at 2048–4096 keys).
    Chunk pk[LOADS], pv[LOADS];
#pragma unroll
    for (int i = 0; i < LOADS; i++) pk[i] = pv[i] = KE::zero();
    const size_t step_rs = (size_t)KSTEP * rs;
    auto fetch = [&](int t0) {
        const int rem = kv_len - t0 - key0;  // load n is in the step's keys while KSTEP·n < rem
        const Chunk* kt = kb + (size_t)t0 * rs;
        const Chunk* vt = vb + (size_t)t0 * rs;
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            if (i * KSTEP < rem) {
                pk[i] = __ldcg(kt + i * step_rs);
                pv[i] = __ldcg(vt + i * step_rs);
            }
        }
    };
    auto store_tile = [&]() {
#pragma unroll
        for (int i = 0; i < LOADS; i++) {
            if constexpr (F32) {
                const int idx = threadIdx.x + i * TC_WARPS * 32, key = idx / D4, c = idx % D4;
                sk[key][c ^ ((key & 1) << 2)] = pk[i];
                reinterpret_cast<float4*>(&sv[key][0])[c ^ (((key >> 1) & 3) << 1)] = pv[i];
            } else {  // a chunk widens to float4 columns c and c + 1 (c even: the swizzles keep them adjacent)
                const int idx = threadIdx.x + i * TC_WARPS * 32, key = idx / DC, c = 2 * (idx % DC);
                const int ck = c ^ ((key & 1) << 2), cv = c ^ (((key >> 1) & 3) << 1);
                float4* vrow = reinterpret_cast<float4*>(&sv[key][0]);
                KE::widen(pk[i], sk[key][ck], sk[key][ck + 1]);
                KE::widen(pv[i], vrow[cv], vrow[cv + 1]);
            }
        }
    };
    // Cache rows below first_pos were written by earlier, completed steps (attention.cu): a
    // first tile of such rows only is asked for before the wait; the step's own rows after it.
    const bool early = j0 + TC_TK <= first_pos;
    if (early) fetch(j0);
    pdl_wait();
    TC_MARK(1);
    if (!early) fetch(j0);
    // Q, pre-scaled by 1/√hd and split once per block into TF32 big and small parts, stored in
    // fragment order. Thread i builds lane (g, t)'s fragments of m-tile mt, chunk ch from the
    // float4s of dims 16·ch + 4t .. +3 of its rows mt·16 + g (a0, a2) and mt·16 + g + 8 (a1, a3):
    // step 0 takes dims 4t, 4t + 1 and step 1 dims 4t + 2, 4t + 3 (the slot mapping above).
    // All of a thread's Q loads go out before any is used: written as a loop over i with the
    // block size as its stride, the second item's loads waited for the first's stores, and Q
    // staging took 3.3 of a one-tile block's 8 µs (time-stamped by TC_MARK). Q is the
    // previous kernel's output, read through L2 (__ldcg): read plainly through the __restrict__
    // pointer, ptxas moved the loads above the PDL wait at hd 128 (common.cuh).
    constexpr int QITEMS = 2 * CHUNKS * 32, QPER = QITEMS / (TC_WARPS * 32);
    static_assert(QITEMS % (TC_WARPS * 32) == 0, "Q items split evenly over the block");
    float4 qv[QPER][2];
#pragma unroll
    for (int it = 0; it < QPER; it++) {
        const int i = threadIdx.x + it * TC_WARPS * 32;
        const int fl = i & 31, ch = (i >> 5) % CHUNKS, m_t = i / (32 * CHUNKS);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int qi = q0 + m_t * 16 + (fl >> 2) + 8 * h;
            qv[it][h] = make_float4(0.f, 0.f, 0.f, 0.f);
            if (qi < Q) qv[it][h] = __ldcg(reinterpret_cast<const float4*>(q + ((size_t)sb.row(qi) * nh + sb.head(qi)) * HD) + ch * 4 + (fl & 3));
        }
    }
#pragma unroll
    for (int it = 0; it < QPER; it++) {
        const int i = threadIdx.x + it * TC_WARPS * 32;
        const int fl = i & 31, ch = (i >> 5) % CHUNKS, m_t = i / (32 * CHUNKS);
        float4* val = qv[it];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            val[h].x *= scale; val[h].y *= scale; val[h].z *= scale; val[h].w *= scale;
        }
        uint4 b0, s0, b1, s1;
        split_tf32(val[0].x, b0.x, s0.x);
        split_tf32(val[1].x, b0.y, s0.y);
        split_tf32(val[0].y, b0.z, s0.z);
        split_tf32(val[1].y, b0.w, s0.w);
        split_tf32(val[0].z, b1.x, s1.x);
        split_tf32(val[1].z, b1.y, s1.y);
        split_tf32(val[0].w, b1.z, s1.z);
        split_tf32(val[1].w, b1.w, s1.w);
        sqb[m_t][ch][0][fl] = b0;
        sqb[m_t][ch][1][fl] = b1;
        if constexpr (!LP) {
            sqs[m_t][ch][0][fl] = s0;
            sqs[m_t][ch][1][fl] = s1;
        }
    }
    TC_MARK(2);
    store_tile();

    // Roles. Scores: warp w computes S for m-tile w & 1 and keys 8·(w >> 1) .. +8 of the tile.
    // Softmax: warp w owns query rows 4w .. 4w+3 (lane = key). P·V: warp w accumulates O for
    // m-tile w & 1 and dims (hd/4)·(w >> 1) .. +hd/4 over all 32 keys.
    const int mt = warp & 1, quarter = warp >> 1;
    // A warp whose m-tile holds no query of this block (a decode row's 4 queries, or up to four
    // verify rows' 16, leave m-tile 1 empty) skips its S and P·V MMAs: every other row's
    // instructions are unchanged, so their bits are too, and a one-row step costs half the MMAs.
    const bool mt_live = q0 + mt * 16 < Q;  // warp-uniform, as mma.sync needs
    const int ra = mt * 16 + g, rb = ra + 8;  // the lane's two rows in the S and P·V fragments
    float m_row[4], l_row[4];
    int vis[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int qi = q0 + 4 * warp + i;
        m_row[i] = -INFINITY;
        l_row[i] = 0.f;
        vis[i] = qi >= Q ? 0 : causal ? min(first_pos + sb.row(qi) + 1, kv_len) : kv_len;
    }
    float o[NQ][4];
#pragma unroll
    for (int n = 0; n < NQ; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    for (int t0 = j0; t0 < kv_len; t0 += step) {
        if (t0 != j0) {  // later tiles: their loads went out during the previous tile's compute
            __syncthreads();  // the previous tile is no longer being read
            store_tile();
        }
        __syncthreads();
        if (t0 == j0) TC_MARK(3);
        // The next tile's K/V loads are in flight (in registers) while this tile is computed.
        if (t0 + step < kv_len) fetch(t0 + step);

        // S = Q·Kᵀ for 16 queries × 8 keys (one n-tile), 3xTF32.
        if (mt_live) {
            const int key = quarter * 8 + g, sw = (g & 1) << 2;  // rows ra, rb and the key share g's parity
            float sb[4] = {0.f, 0.f, 0.f, 0.f}, ss[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int ch = 0; ch < CHUNKS; ch++) {
                const int c4 = ch * 4 + t;
                const uint4 q0b = sqb[mt][ch][0][lane], q1b = sqb[mt][ch][1][lane];
                const float4 kk = sk[key][c4 ^ sw];
                if constexpr (LP) {
                    const uint32_t bb[4] = {tf32_big(kk.x), tf32_big(kk.y), tf32_big(kk.z), tf32_big(kk.w)};
                    mma_tf32(sb, q0b.x, q0b.y, q0b.z, q0b.w, bb[0], bb[1]);
                    mma_tf32(sb, q1b.x, q1b.y, q1b.z, q1b.w, bb[2], bb[3]);
                    continue;
                }
                const uint4 q0s = sqs[mt][ch][0][lane], q1s = sqs[mt][ch][1][lane];
                if constexpr (EXACT) {
                    const uint32_t bb[4] = {__float_as_uint(kk.x), __float_as_uint(kk.y), __float_as_uint(kk.z),
                                            __float_as_uint(kk.w)};
                    mma_2xtf32(sb, ss, &q0b.x, &q0s.x, &bb[0]);
                    mma_2xtf32(sb, ss, &q1b.x, &q1s.x, &bb[2]);
                } else {
                    uint32_t bb[4], bs[4];
                    split_tf32(kk.x, bb[0], bs[0]);
                    split_tf32(kk.y, bb[1], bs[1]);
                    split_tf32(kk.z, bb[2], bs[2]);
                    split_tf32(kk.w, bb[3], bs[3]);
                    mma_3xtf32(sb, ss, &q0b.x, &q0s.x, &bb[0], &bs[0]);
                    mma_3xtf32(sb, ss, &q1b.x, &q1s.x, &bb[2], &bs[2]);
                }
            }
            const int col = quarter * 8 + 2 * t;
            sp[ra][col] = sb[0] + ss[0];
            sp[ra][col + 1] = sb[1] + ss[1];
            sp[rb][col] = sb[2] + ss[2];
            sp[rb][col + 1] = sb[3] + ss[3];
        }
        __syncthreads();
        if (t0 == j0) TC_MARK(4);

        // Online softmax, one row at a time per warp, lane = key: P replaces S in place. Each
        // lane keeps its own share of the row sum l (every lane sees the same max, so the
        // shares rescale alike); they are added once, after the last tile, instead of one
        // five-shuffle reduction per row and tile. The exponentials use the hardware ex2
        // (__expf: about 2⁻²¹ relative at the arguments that matter, well inside the 1e-5
        // tests) rather than expf's ten-instruction exact path.
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = 4 * warp + i, key = t0 + lane;
            const bool valid = key < vis[i];  // vis ≤ kv_len
            const float s = valid ? sp[r][lane] : -INFINITY;
            const float m_new = fmaxf(m_row[i], warp_max(s));
            // A row with no visible key so far keeps m = −inf, l = 0 and O = 0 (all its p are 0).
            const float corr = m_new == -INFINITY ? 1.f : __expf(m_row[i] - m_new);
            const float p = valid ? __expf(s - m_new) : 0.f;
            l_row[i] = l_row[i] * corr + p;
            m_row[i] = m_new;
            sp[r][lane] = p;
            if (lane == 0) scorr[r] = corr;
        }
        __syncthreads();
        if (t0 == j0) TC_MARK(5);

        // O = O·corr + P·V for 16 rows × hd/4 dims over the tile's 32 keys (4 k8 steps), 3xTF32.
        if (mt_live) {
            const float ca = scorr[ra], cb = scorr[rb];
#pragma unroll
            for (int n = 0; n < NQ; n++) {
                o[n][0] *= ca; o[n][1] *= ca;
                o[n][2] *= cb; o[n][3] *= cb;
            }
#pragma unroll
            for (int ks = 0; ks < TC_TK / 8; ks++) {
                // Slot t ↔ key 8ks + 2t, slot t+4 ↔ key 8ks + 2t + 1, in A (P) and B (V) alike.
                const int key = 8 * ks + 2 * t;
                uint32_t pb[4], ps[4];
                if constexpr (LP) {
                    pb[0] = tf32_big(sp[ra][key]);
                    pb[1] = tf32_big(sp[rb][key]);
                    pb[2] = tf32_big(sp[ra][key + 1]);
                    pb[3] = tf32_big(sp[rb][key + 1]);
                } else {
                    split_tf32(sp[ra][key], pb[0], ps[0]);
                    split_tf32(sp[rb][key], pb[1], ps[1]);
                    split_tf32(sp[ra][key + 1], pb[2], ps[2]);
                    split_tf32(sp[rb][key + 1], pb[3], ps[3]);
                }
#pragma unroll
                for (int n = 0; n < NQ; n++) {
                    const int d = (quarter * (HD / 4) + 8 * n + g) ^ (t << 3);  // (key / 2) & 3 == t
                    // O has one accumulator, so the small terms go in before the big one.
                    if constexpr (LP) {
                        mma_tf32(o[n], pb[0], pb[1], pb[2], pb[3], tf32_big(sv[key][d]), tf32_big(sv[key + 1][d]));
                    } else if constexpr (EXACT) {
                        const uint32_t b0 = __float_as_uint(sv[key][d]), b1 = __float_as_uint(sv[key + 1][d]);
                        mma_tf32(o[n], ps[0], ps[1], ps[2], ps[3], b0, b1);
                        mma_tf32(o[n], pb[0], pb[1], pb[2], pb[3], b0, b1);
                    } else {
                        uint32_t bb[2], bs[2];
                        split_tf32(sv[key][d], bb[0], bs[0]);
                        split_tf32(sv[key + 1][d], bb[1], bs[1]);
                        mma_tf32(o[n], pb[0], pb[1], pb[2], pb[3], bs[0], bs[1]);
                        mma_tf32(o[n], ps[0], ps[1], ps[2], ps[3], bb[0], bb[1]);
                        mma_tf32(o[n], pb[0], pb[1], pb[2], pb[3], bb[0], bb[1]);
                    }
                }
            }
        }
    }

    TC_MARK(6);
    // The unnormalised partial: m and l from the softmax warps, Σ p·v from the P·V warps.
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int qi = q0 + 4 * warp + i;
        const float l = warp_sum(l_row[i]);
        if (lane == 0 && qi < Q) {
            part_ml[slot_of(qi) * 2] = m_row[i];
            part_ml[slot_of(qi) * 2 + 1] = l;
        }
    }
    const int qa = q0 + ra, qb = q0 + rb;
#pragma unroll
    for (int n = 0; n < NQ; n++) {
        const int d = quarter * (HD / 4) + 8 * n + 2 * t;
        if (qa < Q) *reinterpret_cast<float2*>(part_o + slot_of(qa) * HD + d) = make_float2(o[n][0], o[n][1]);
        if (qb < Q) *reinterpret_cast<float2*>(part_o + slot_of(qb) * HD + d) = make_float2(o[n][2], o[n][3]);
    }
    TC_MARK(7);
}

// Dynamic shared memory of attention_tc for head dim hd (the host sets the same figure).
#define TC_SMEM(HD) ((2 * TC_Q + 2 * TC_TK) * (HD) * 4 + (TC_Q + 1) * TC_SP * 4)

// E: the cache element, as in attention.cu; LP: the one-MMA (`attention_tc1_*`) twins.
#define TC_KERNEL_E(PER, E, LP, NAME)                                                                              \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32, 2)                                                 \
        NAME(const float* q, const E* k, const E* v, float* part_o, float* part_ml, int rows, int nh, int nkv,      \
             const int* lens, int causal, int stride) {                                                            \
        attention_tc<PER, E, LP>(q, k, v, part_o, part_ml, rows, nh, nkv, lens, causal, stride, blockIdx.x,        \
                                 blockIdx.y);                                                                      \
    }
TC_KERNEL_E(2, float, false, attention_tc_hd64_f32)
TC_KERNEL_E(4, float, false, attention_tc_hd128_f32)
TC_KERNEL_E(2, __nv_bfloat16, false, attention_tc_hd64_f32_kvbf16)
TC_KERNEL_E(4, __nv_bfloat16, false, attention_tc_hd128_f32_kvbf16)
TC_KERNEL_E(2, float, true, attention_tc1_hd64_f32)
TC_KERNEL_E(4, float, true, attention_tc1_hd128_f32)
TC_KERNEL_E(2, __nv_bfloat16, true, attention_tc1_hd64_f32_kvbf16)
TC_KERNEL_E(4, __nv_bfloat16, true, attention_tc1_hd128_f32_kvbf16)

// Segmented twins (issue #30's batched steps): the sequences of a step in one launch, blockIdx.z
// the sequence (AttnSeg). Grid: x = nkv × the most query groups of any sequence, y = the most
// slices; a block past its sequence's groups or slices leaves. Every other block runs the body
// above on its sequence's rows, caches, partials and slice count, as that sequence's own launch
// would: the same bits.
#define TC_SEG_KERNEL(PER, E, LP, NAME)                                                                            \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32, 2)                                                 \
        NAME(const AttnSeg* segs, int nh, int nkv, int causal, int stride) {                                       \
        const AttnSeg sg = segs[blockIdx.z];                                                                       \
        const int groups = (sg.rows * (nh / nkv) + TC_Q - 1) / TC_Q;                                               \
        if ((int)blockIdx.x >= nkv * groups || (int)blockIdx.y >= sg.splits) return;                               \
        attention_tc<PER, E, LP>(sg.q, reinterpret_cast<const E*>(sg.k), reinterpret_cast<const E*>(sg.v),          \
                                 sg.part_o, sg.part_ml, sg.rows, nh, nkv, sg.lens, causal, stride, blockIdx.x,     \
                                 blockIdx.y);                                                                      \
    }
TC_SEG_KERNEL(2, float, false, attention_tc_seg_hd64_f32)
TC_SEG_KERNEL(4, float, false, attention_tc_seg_hd128_f32)
TC_SEG_KERNEL(2, __nv_bfloat16, false, attention_tc_seg_hd64_f32_kvbf16)
TC_SEG_KERNEL(4, __nv_bfloat16, false, attention_tc_seg_hd128_f32_kvbf16)
TC_SEG_KERNEL(2, float, true, attention_tc1_seg_hd64_f32)
TC_SEG_KERNEL(4, float, true, attention_tc1_seg_hd128_f32)
TC_SEG_KERNEL(2, __nv_bfloat16, true, attention_tc1_seg_hd64_f32_kvbf16)
TC_SEG_KERNEL(4, __nv_bfloat16, true, attention_tc1_seg_hd128_f32_kvbf16)
