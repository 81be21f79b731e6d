// Causal attention for a prefill chunk on the bf16 tensor cores, FlashAttention-2 style.
//
// q [rows, nh, hd] f32 (normed and rotated), K and V caches [≥ kv_len, nkv, hd] (f32 or bf16),
// out [rows, nh, hd] f32. Row r of the chunk sits at position first_pos + r and sees keys
// 0 .. vis(r) − 1, vis(r) = min(first_pos + r + 1, kv_len) (lens = [first_pos, kv_len] in device
// memory, as every step kernel reads them); query head h reads KV head h / (nh / nkv).
//   o[r, h] = Σ_j softmax_j(q[r, h]·k[j] / √hd) · v[j]   over j < vis(r)
// Q, K, V and P are rounded to bf16 where they enter an MMA (mma.m16n8k16 bf16, f32
// accumulation); the scores, the softmax (max, sum, rescale) and O stay f32. This is for
// prefill only: the decode and verify kernels (attention.cu, attention_tc.cu) stay f32-exact.
//
// Why: a prefill chunk of hundreds to thousands of rows went to the per-head f32 kernel
// (attention_f32), one block per query row and head. A 4000-token Qwen3-8B prefill is ~4.7
// TFLOP of causal attention (36 layers × 32 heads × 2 products × 4000²/2 × 128 × 2), which only
// the tensor cores run in tens of milliseconds.
//
// Layout. A block of 8 warps owns 128 query rows (PF_BM) of one query head (blockIdx.x = head,
// so a KV head's G query heads are adjacent blocks and share its K/V rows in L2; blockIdx.y =
// the query tile, the last tile first: the tiles that walk the most keys start in the first
// wave, the short ones fill the tail). Warp w owns rows 16w .. 16w + 15 of the tile and keeps,
// in registers, its Q as bf16 A fragments (loaded once from global memory straight into
// fragment order), the running max m and sum l of its two rows per lane, and O (16 × hd, f32).
// The block walks key tiles of 64 (PF_BN) up to the causal limit of its last row; per tile each
// warp computes S = Q·Kᵀ (16 × 64), masks (only in tiles that reach past the first row's
// limit: the diagonal), updates the online softmax, and adds P·V. No split over the keys, no
// partials: one normalised write per row at the end. 128 rows per block rather than 64 halve
// the K/V bytes every block pulls through L2 (at 4000 rows, f32 cache: ~2 GB a layer at 128,
// ~4 GB at 64), which would otherwise take as long as the MMAs.
//
// Softmax. Scores stay raw (q·k); with c = log2(e)/√hd, p = 2^(s·c − m·c) (one FFMA and one
// ex2.approx per score), the rescale of O and l is 2^((m_old − m_new)·c). A row whose keys so far
// are all masked keeps m = −inf (its max is taken as 0 for the exponent, so every p is 0 and
// nothing is NaN); causal prefill has none (key 0 is in every row's first tile), but kv_len = 0
// writes zeros, as the CPU reference does. Each lane sums its own p; the four lanes of a row are
// added once, after the last tile (they share the row's max, so their shares rescale alike).
//
// Fragment mapping (m16n8k16 .bf16, g = lane / 4, t = lane % 4; two bf16 per 32-bit register,
// the lower index in the low half): A 16×16 row-major: a0,a1 = [g][2t, 2t+1], a2,a3 = [g+8][2t,
// 2t+1], a4..a7 the same at columns +8; B 16×8: b0,b1 = [2t, 2t+1][g], b2,b3 = [2t+8, 2t+9][g];
// C: c0,c1 = [g][2t, 2t+1], c2,c3 = [g+8][2t, 2t+1].
// - S = Q·Kᵀ: k = dim, n = key. B[dim][key] = K[key][dim], so a B fragment is two adjacent dims
//   of one key's row: ldmatrix (not transposed) of 8×8 blocks whose rows are keys. One
//   ldmatrix.x4 gives keys 16p .. 16p + 15 (two n-tiles) × dims 16kk .. 16kk + 15 (one k-step).
// - P·V: the S accumulator of n-tiles 2j and 2j + 1 (keys 16j .. 16j + 15) is the A fragment of
//   k-step j: {c0,c1} of tile 2j → a0,a1, {c2,c3} of 2j → a2,a3, {c0,c1} of 2j+1 → a4,a5, {c2,c3}
//   of 2j+1 → a6,a7, each pair packed to bf16x2 (cvt.rn); no shuffle, no shared memory. B[key][dim]
//   = V[key][dim]: keys 2t, 2t+1 of one dim are a column of the row-major V tile, which
//   ldmatrix.trans delivers; one x4 gives keys 16j .. +15 × dims 16p .. 16p + 15 (two n-tiles).
//
// Shared memory: K and V tiles as bf16, [64 keys][hd / 8 chunks of 16 bytes], double-buffered
// (2 × 2 × 64 × hd × 2 bytes: 64 KB at hd 128, dynamic, the host raises the limit at load).
// Chunk c of key row j is stored at chunk c ^ (j & 7): the eight row addresses of every 8×8
// ldmatrix block (eight consecutive keys, one chunk column) then fall in eight distinct 16-byte
// bank groups, and so do the stores of eight lanes (one key row, chunks 0..7).
// Staging, one barrier per tile: tile j + 1's loads are issued right after the barrier that
// opens tile j and land in the other buffer while tile j is computed. A bf16 cache is copied by
// cp.async (16 bytes a thread, zero-filled past the block's keys). An f32 cache cannot be
// narrowed on the way, so its tile goes through registers: each thread loads 8 floats per chunk
// (two 16-byte __ldcg loads) at the top, and after its own P·V rounds them to bf16 and stores the
// chunk; loads past the block's keys are skipped and leave the registers as they were (zeros,
// or an earlier tile's finite rows): such keys are masked (S = −inf, p = 0), so their values
// only enter as 0 · v. Rows past the cache's kv_len are never read (they may be anything).
//
// Causal work: the block loads tiles up to its last row's limit; a warp computes a tile only if
// one of its rows sees its first key (so warps near the top of the block skip the final tile
// or two) and masks it only if its first row does not see the whole tile. Rows past `rows` (a
// partial last query tile) load zero queries, compute harmlessly and are never written.
//
// PDL: the trigger first; lens (host-written) are read before the wait, q, k and v only after it
// and never through the non-coherent path (ARCHITECTURE.md; tests/pdl_audit.rs).
//
// Launch: grid (nh, ⌈rows / 128⌉), 256 threads, dynamic shared memory PF_SMEM(hd).
#include "mma_bf16.cuh"

#define PF_WARPS 8
#define PF_BM (PF_WARPS * 16)  // query rows per block: one m16 tile per warp
#define PF_BN 64               // keys per tile
// Dynamic shared memory of attention_prefill at head dim HD (the host sets the same figure).
#define PF_SMEM(HD) (2 * 2 * PF_BN * (HD) * 2)

__device__ __forceinline__ float ex2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The four 8×8 bf16 blocks whose rows lanes 8i .. 8i + 7 address, block i into r[i]. "memory":
// the tiles are written by other threads between barriers; the loads must stay between them.
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr)
                 : "memory");
}

// E: the cache element (common.cuh KvElem): float or __nv_bfloat16.
template <int HD, typename E>
__device__ __forceinline__ void attention_prefill(const float* q, const E* k, const E* v, float* out, int rows,
                                                  int nh, int nkv, const int* lens, int kv_cap) {
    constexpr bool F32 = KvElem<E>::PER_CHUNK == 4;
    constexpr int THREADS = PF_WARPS * 32;
    constexpr int CPR = HD / 8;                        // 16-byte bf16 chunks per K/V row in shared memory
    constexpr int LOADS = PF_BN * CPR / THREADS;       // chunks of K (and of V) per thread and tile
    constexpr int KSTEP = THREADS / CPR;               // keys between one thread's chunks
    constexpr int BUF = PF_BN * CPR;                   // uint4 per K (or V) tile
    constexpr int KK = HD / 16;                        // k-steps of S = Q·Kᵀ
    constexpr int NS = PF_BN / 8;                      // n-tiles of S (keys)
    constexpr int NO = HD / 8;                         // n-tiles of O (dims)
    static_assert(PF_BN * CPR % THREADS == 0 && THREADS % CPR == 0 && KSTEP % 8 == 0, "tile split");
    static_assert(CPR >= 8, "the swizzle needs 8 chunks per row");
    extern __shared__ uint4 pf_smem[];
    uint4* const sk = pf_smem;            // [2][PF_BN][CPR]
    uint4* const sv = pf_smem + 2 * BUF;  // [2][PF_BN][CPR]
    pdl_trigger();

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int first_pos = lens[0], kv_len = min(lens[1], kv_cap);  // host-written: safe before the wait
    const int h = blockIdx.x, kvh = h / (nh / nkv);
    const int q0 = (gridDim.y - 1 - blockIdx.y) * PF_BM;
    auto vis = [&](int r) { return min(first_pos + r + 1, kv_len); };
    const int limit = vis(min(q0 + PF_BM, rows) - 1);  // the block's keys: 0 .. limit − 1
    const int ntiles = (limit + PF_BN - 1) / PF_BN;
    const int rw = q0 + 16 * warp;                               // the warp's first row
    const int wend = rw < rows ? vis(min(rw + 15, rows - 1)) : 0;  // keys any of its rows sees
    const int wfull = vis(rw);                                   // keys all of its rows see
    const int ra = rw + g, rb = ra + 8;                          // the lane's two rows
    const int va = vis(ra), vb = vis(rb);  // keys rows ra and rb see (not to be shadowed)
    const float sl2 = 1.4426950408889634f * rsqrtf((float)HD);  // log2(e) / √hd

    // This thread's K/V chunks of a tile: keys lkey + n·KSTEP, chunk column lc (stored at
    // lc ^ (key & 7), the same for every n as KSTEP is a multiple of 8).
    const int lkey = threadIdx.x / CPR, lc = threadIdx.x % CPR;
    const int slot = lkey * CPR + (lc ^ (lkey & 7));
    const size_t rowe = (size_t)nkv * HD;  // elements from one cache row to the next
    const size_t goff = (size_t)lkey * rowe + (size_t)kvh * HD + (size_t)lc * 8;
    const E* const kt = k + goff;
    const E* const vt = v + goff;

    // f32 caches: a tile's chunks in registers between its loads and its stores.
    float4 rk[F32 ? LOADS : 1][2], rv[F32 ? LOADS : 1][2];
    if constexpr (F32) {
#pragma unroll
        for (int n = 0; n < LOADS; n++)
            rk[n][0] = rk[n][1] = rv[n][0] = rv[n][1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    // Tile j's loads (keys j·64 ..): bf16 by cp.async into buffer b, f32 into the registers.
    auto fetch = [&](int j, int b) {
        const int t0 = j * PF_BN;
#pragma unroll
        for (int n = 0; n < LOADS; n++) {
            const bool ok = t0 + lkey + n * KSTEP < limit;
            const size_t off = (size_t)(t0 + n * KSTEP) * rowe;
            if constexpr (F32) {
                if (ok) {
                    const float4* kp = reinterpret_cast<const float4*>(kt + off);
                    const float4* vp = reinterpret_cast<const float4*>(vt + off);
                    rk[n][0] = __ldcg(kp);
                    rk[n][1] = __ldcg(kp + 1);
                    rv[n][0] = __ldcg(vp);
                    rv[n][1] = __ldcg(vp + 1);
                }
            } else {
                // Nothing is read where !ok (zero-filled); the address is then the cache's start.
                cp_async16(sk + b * BUF + slot + n * KSTEP * CPR, ok ? kt + off : k, ok);
                cp_async16(sv + b * BUF + slot + n * KSTEP * CPR, ok ? vt + off : v, ok);
            }
        }
        if constexpr (!F32) cp_async_commit();
    };
    // f32 caches: the registers rounded to bf16 into buffer b.
    auto store = [&](int b) {
        if constexpr (F32) {
#pragma unroll
            for (int n = 0; n < LOADS; n++) {
                const float4 k0 = rk[n][0], k1 = rk[n][1], v0 = rv[n][0], v1 = rv[n][1];
                sk[b * BUF + slot + n * KSTEP * CPR] = make_uint4(pack_bf16(k0.x, k0.y), pack_bf16(k0.z, k0.w),
                                                                  pack_bf16(k1.x, k1.y), pack_bf16(k1.z, k1.w));
                sv[b * BUF + slot + n * KSTEP * CPR] = make_uint4(pack_bf16(v0.x, v0.y), pack_bf16(v0.z, v0.w),
                                                                  pack_bf16(v1.x, v1.y), pack_bf16(v1.z, v1.w));
            }
        }
    };

    pdl_wait();
    if (ntiles > 0) fetch(0, 0);

    // Q as bf16 A fragments, straight from global memory (read once per block): k-step kk holds
    // dims 16kk + 2t, +1 of rows ra (a0,a1) and rb (a2,a3), and the same at +8 (a4..a7).
    uint32_t qa[KK][4];
    {
        const float* qra = q + ((size_t)ra * nh + h) * HD + 2 * t;
        const float* qrb = q + ((size_t)rb * nh + h) * HD + 2 * t;
        float2 x[KK][4];
#pragma unroll
        for (int kk = 0; kk < KK; kk++) {
            const float2 z = make_float2(0.f, 0.f);
            x[kk][0] = ra < rows ? __ldcg(reinterpret_cast<const float2*>(qra + 16 * kk)) : z;
            x[kk][1] = rb < rows ? __ldcg(reinterpret_cast<const float2*>(qrb + 16 * kk)) : z;
            x[kk][2] = ra < rows ? __ldcg(reinterpret_cast<const float2*>(qra + 16 * kk + 8)) : z;
            x[kk][3] = rb < rows ? __ldcg(reinterpret_cast<const float2*>(qrb + 16 * kk + 8)) : z;
        }
#pragma unroll
        for (int kk = 0; kk < KK; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++) qa[kk][i] = pack_bf16(x[kk][i].x, x[kk][i].y);
    }
    if constexpr (F32) store(0);

    // The lane's ldmatrix rows. K (S = Q·Kᵀ): lanes 8i .. 8i + 7 address block i = (keys
    // 16p + 8·(i >> 1) .. +7, dims 16kk + 8·(i & 1) .. +7), so r0, r1 are n-tile 2p's b0b1, b2b3
    // and r2, r3 n-tile 2p + 1's. V (P·V, transposed): block i = (keys 16j + 8·(i & 1) .., dims
    // 16p + 8·(i >> 1) ..), so r0, r1 are n-tile 2p's b0b1, b2b3 and r2, r3 n-tile 2p + 1's.
    // Every row address has key & 7 = lane & 7, so its stored chunk is chunk ^ (lane & 7).
    const int x7 = lane & 7;
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(pf_smem);
    const int krow = x7 + ((lane >> 4) << 3), khi = (lane >> 3) & 1;
    const int vrow = x7 + (((lane >> 3) & 1) << 3), vhi = lane >> 4;
    const uint32_t kaddr = sbase + (uint32_t)(krow * CPR) * 16u;
    const uint32_t vaddr = sbase + (uint32_t)(2 * BUF + vrow * CPR) * 16u;
    const int ky = khi ^ x7, vy = vhi ^ x7;  // (2c + hi) ^ x7 = 2c ^ (hi ^ x7)

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    for (int j = 0; j < ntiles; j++) {
        const int cur = j & 1, t0 = j * PF_BN;
        if constexpr (!F32) cp_async_wait_all();
        // Tile j is in buffer cur for every thread; every warp is done with tile j − 1, whose
        // buffer the next loads overwrite.
        __syncthreads();
        const bool more = j + 1 < ntiles;
        if (more) fetch(j + 1, cur ^ 1);

        if (t0 < wend) {
            const uint32_t ksm = kaddr + (uint32_t)(cur * BUF) * 16u, vsm = vaddr + (uint32_t)(cur * BUF) * 16u;
            // S = Q·Kᵀ, 16 rows × 64 keys.
            float s[NS][4];
#pragma unroll
            for (int n = 0; n < NS; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KK; kk++) {
#pragma unroll
                for (int p = 0; p < NS / 2; p++) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4(ksm + (uint32_t)(16 * p * CPR + ((2 * kk) ^ ky)) * 16u, b0, b1, b2, b3);
                    mma_bf16(s[2 * p], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b0, b1);
                    mma_bf16(s[2 * p + 1], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b2, b3);
                }
            }
            // The diagonal: key t0 + 8n + 2t + e is visible to row ra while it is < va.
            if (t0 + PF_BN > wfull) {
                const int ca = va - t0 - 2 * t, cb = vb - t0 - 2 * t;
#pragma unroll
                for (int n = 0; n < NS; n++) {
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        if (8 * n + e >= ca) s[n][e] = -INFINITY;
                        if (8 * n + e >= cb) s[n][2 + e] = -INFINITY;
                    }
                }
            }
            // Online softmax: the rows' new max over the quad, the rescale, then p.
            float mx[2] = {m[0], m[1]};
#pragma unroll
            for (int n = 0; n < NS; n++) {
                mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
                mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
            }
            float ms[2], corr[2];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
                mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
                ms[i] = mx[i] == -INFINITY ? 0.f : mx[i] * sl2;
                corr[i] = ex2_approx(fmaf(m[i], sl2, -ms[i]));  // m = −inf: 0 (O and l are 0)
                m[i] = mx[i];
                l[i] *= corr[i];
            }
#pragma unroll
            for (int n = 0; n < NO; n++) {
                o[n][0] *= corr[0]; o[n][1] *= corr[0];
                o[n][2] *= corr[1]; o[n][3] *= corr[1];
            }
            // P as the A fragments of P·V (k-step jj = keys 16jj .. 16jj + 15).
            uint32_t pa[PF_BN / 16][4];
#pragma unroll
            for (int jj = 0; jj < PF_BN / 16; jj++) {
                float p[2][4];
#pragma unroll
                for (int u = 0; u < 2; u++) {
                    p[u][0] = ex2_approx(fmaf(s[2 * jj + u][0], sl2, -ms[0]));
                    p[u][1] = ex2_approx(fmaf(s[2 * jj + u][1], sl2, -ms[0]));
                    p[u][2] = ex2_approx(fmaf(s[2 * jj + u][2], sl2, -ms[1]));
                    p[u][3] = ex2_approx(fmaf(s[2 * jj + u][3], sl2, -ms[1]));
                    l[0] += p[u][0] + p[u][1];
                    l[1] += p[u][2] + p[u][3];
                }
                pa[jj][0] = pack_bf16(p[0][0], p[0][1]);
                pa[jj][1] = pack_bf16(p[0][2], p[0][3]);
                pa[jj][2] = pack_bf16(p[1][0], p[1][1]);
                pa[jj][3] = pack_bf16(p[1][2], p[1][3]);
            }
            // O += P·V, 16 rows × hd.
#pragma unroll
            for (int jj = 0; jj < PF_BN / 16; jj++) {
#pragma unroll
                for (int p = 0; p < NO / 2; p++) {
                    uint32_t b0, b1, b2, b3;
                    ldsm_x4_trans(vsm + (uint32_t)(16 * jj * CPR + ((2 * p) ^ vy)) * 16u, b0, b1, b2, b3);
                    mma_bf16(o[2 * p], pa[jj][0], pa[jj][1], pa[jj][2], pa[jj][3], b0, b1);
                    mma_bf16(o[2 * p + 1], pa[jj][0], pa[jj][1], pa[jj][2], pa[jj][3], b2, b3);
                }
            }
        }
        // f32: tile j + 1 into the other buffer (every warp finished reading it before the
        // barrier above); the next barrier publishes it.
        if constexpr (F32) {
            if (more) store(cur ^ 1);
        }
    }

    // The row sums over the quad, then one normalised write per row (rows past `rows` none).
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    const float ia = l[0] > 0.f ? 1.f / l[0] : 0.f, ib = l[1] > 0.f ? 1.f / l[1] : 0.f;
    float* oa = out + ((size_t)ra * nh + h) * HD + 2 * t;
    float* ob = out + ((size_t)rb * nh + h) * HD + 2 * t;
#pragma unroll
    for (int n = 0; n < NO; n++) {
        if (ra < rows) *reinterpret_cast<float2*>(oa + 8 * n) = make_float2(o[n][0] * ia, o[n][1] * ia);
        if (rb < rows) *reinterpret_cast<float2*>(ob + 8 * n) = make_float2(o[n][2] * ib, o[n][3] * ib);
    }
}

#define PF_KERNEL(HD, E, NAME)                                                                                     \
    extern "C" __global__ void __launch_bounds__(PF_WARPS * 32, 1)                                                 \
        NAME(const float* q, const E* k, const E* v, float* out, int rows, int nh, int nkv, const int* lens,       \
             int kv_cap) {                                                                                         \
        attention_prefill<HD, E>(q, k, v, out, rows, nh, nkv, lens, kv_cap);                                       \
    }
PF_KERNEL(64, float, attention_prefill_hd64_f32)
PF_KERNEL(128, float, attention_prefill_hd128_f32)
PF_KERNEL(64, __nv_bfloat16, attention_prefill_hd64_f32_kvbf16)
PF_KERNEL(128, __nv_bfloat16, attention_prefill_hd128_f32_kvbf16)
