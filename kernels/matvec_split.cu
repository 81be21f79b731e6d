// Wide bf16-activation matvecs with x staged once per block: y[m, o] (+)= Σ_k x[m, k] · W[o, k]
// for launches of 64 activation rows (33–64), the same bits as the 8-row `_x1` kernels of matvec.cu.
//
// Why: the wide `_x1` / `_x1h` twins in matvec.cu give every warp its own 16 weight rows and
// have it load all of x's rows for them. At K split 8 (q, o, q|k|v, down, the draft's fc) a
// block is one tile, so every block reads all of x from L2 — M/16 times the weight bytes, four
// times them at 64 rows — and each warp waits on those loads (ncu: DRAM 14–33%, 25% warps
// active, long-scoreboard stalls; docs/perf.md, issue #30). cuBLAS's time at 64 rows is flat.
//
// Layout: a block is 8 warps = 8 consecutive 16-row tiles (128 weight rows) at one part s of the
// K split that the 8-row kernel uses for the shape (matvec.rs `ksplit`); the grid is
// ⌈tiles / 8⌉ · ksplit blocks, the parts of a tile group adjacent. Warp w multiplies tile
// 8·grp + w over the chunks the 8-row kernel's warp s takes (k = 32·s + j·32·ksplit), in the
// same order, with the same fragments and MMAs (mma_bf16.cuh `mma_chunk1`), so its partial sum
// is that warp's bit for bit. x for those chunks is staged by the whole block with cp.async
// into a ring of shared-memory stages (2 chunks of all rows a stage, a few stages ahead), so x
// leaves L2 once per 128 weight rows instead of once per 16, and each warp reads its
// fragments from shared memory (16-byte reads, rows' halves swizzled so a read has no bank
// conflict). Weights stream as in matvec.cu: 16 bytes a lane past L1, a step ahead in registers.
//
// The 8-row kernel adds its parts' partial sums through shared memory in the fixed order
// 0 + p0 + p1 + …; here the parts are different blocks of one thread-block cluster of 8 (sm_90;
// 8 / ksplit tile groups a cluster, the grid padded to whole clusters). Each block leaves its
// warps' partial sums in its shared memory; after a cluster barrier, block (group, s) adds, for
// the tiles the 8-row kernel's block (group, s) holds (8 / ksplit of them), every part's sums
// read from the other blocks' shared memory in that order, and runs those tiles' epilogue: the
// pending RMSNorm scale (ss_in), the residual add, y·γ as f32 or bf16 rows with that 8-row
// block's partial Σ y² (ss_out [m, ogrid], `ogrid` the 8-row kernel's grid, over its tiles in
// its order), or the SwiGLU. So the epilogue is spread over the parts' blocks, with no workspace
// in global memory, fences or tickets (where the last block of a group to arrive did the whole
// group's: ~10 µs of a 30 µs q launch). Every row's outputs are those of the 8-row launch,
// whatever the rows beside it.
#include "common.cuh"
#include "mma_bf16.cuh"

#define SPLIT_WARPS 8
#define SPLIT_U 2  // chunks of 32 k a stage

__device__ __forceinline__ float silu_split(float g) { return g / (1.f + expf(-g)); }

// Thread-block clusters (sm_90): a tile group's K-split parts are blocks of one cluster of 8
// (8 / ksplit groups a cluster), which add each other's partial sums from shared memory.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SPLIT_CLUSTERS 1
#define SPLIT_CLUSTER_DIMS __cluster_dims__(SPLIT_CLUSTER, 1, 1)
#else
#define SPLIT_CLUSTERS 0
#define SPLIT_CLUSTER_DIMS
#endif
#define SPLIT_CLUSTER 8

// Every thread of every block of the cluster arrives, then waits: shared-memory writes before
// it are visible to the cluster's blocks after it (release / acquire).
__device__ __forceinline__ void cluster_sync() {
#if SPLIT_CLUSTERS
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// A float4 at `p` (this block's shared memory) in the shared memory of cluster block `rank`.
__device__ __forceinline__ float4 cluster_ld(const float4* p, int rank) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if SPLIT_CLUSTERS
    const unsigned local = (unsigned)__cvta_generic_to_shared(p);
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
    asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(remote) : "memory");
#endif
    return v;
}

template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// XH: x holds bf16 rows (a norm producer's xg); else f32 rows, rounded to bf16 as mma_chunk1
// rounds them. NG: groups of 8 activation rows a launch.
template <bool SWIGLU, bool XH, int NG>
__device__ void matvec_split(const __nv_bfloat16* __restrict__ w, const void* xp, float* y, int m, int in, int out,
                             int accumulate, int ksplit, const float* ss_in, int parts, float eps,
                             const float* gamma, void* xgp, float* ss_out, int xg_bf16, int ogrid) {
#if !SPLIT_CLUSTERS
    __trap();  // Hopper only: the host never launches these without clusters (matvec_split.rs)
#else
    constexpr int R = NG * 8;                // activation rows a launch holds
    constexpr int XB = XH ? 2 : 4;           // bytes a value of x
    constexpr int ROWB = SPLIT_U * 32 * XB;  // bytes of a row in a stage
    constexpr int SEGS = ROWB / 16;          // its 16-byte segments
    constexpr int STAGE = R * ROWB;
    constexpr int NS = XH ? 4 : 3;  // stages in the ring (matvec_split.rs `split_smem`)
    constexpr int BC = R + 1;       // the epilogue buffer's row pitch in floats (no bank conflicts)
    constexpr int PARTIALS = SPLIT_WARPS * NG * 32 * 16;  // bytes of the block's partial sums
    extern __shared__ uint4 split_smem[];
    char* ring = reinterpret_cast<char*>(split_smem);
    __shared__ float inv_rms[R];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int ks = ksplit;
    const int grp = blockIdx.x / ks, s = blockIdx.x % ks;
    const int tiles = (out + 15) / 16;
    const int tile = grp * SPLIT_WARPS + warp;
    const bool live = tile < tiles;
    const int row0 = min(tile, tiles - 1) * 16;
    const int ra = min(row0 + g, out - 1), rb = min(row0 + g + 8, out - 1);  // clamped: in bounds
    const uint4* wa = reinterpret_cast<const uint4*>(w + (size_t)ra * in);
    const uint4* wb = reinterpret_cast<const uint4*>(w + (size_t)rb * in);
    const int stride = ks * 32, kbeg = s * 32;
    // This part's chunks: k = kbeg + j·stride for j < nj (the 8-row kernel's warp s takes the
    // same; chunks of its last step past in meet zero weights there and zero weights and x here).
    const int nj = kbeg < in ? (in - kbeg + stride - 1) / stride : 0;
    // A block past the last tile group (the grid is padded to whole clusters) only takes part
    // in the cluster's barriers.
    const int nsteps = grp * SPLIT_WARPS < tiles ? (nj + SPLIT_U - 1) / SPLIT_U : 0;
    const char* xb = reinterpret_cast<const char*>(xp);

    // Stage i: chunks j = i·U + u of every row into ring slot i % NS. Segment `seg` of row `row`
    // sits at seg ^ swz(row): odd rows swap halves, so a warp's 16-byte fragment reads (rows g,
    // g+1 in one phase) fall in different banks.
    auto swz = [](int row) { return XH ? (row & 1) << 2 : (row & 1); };
    // Each thread copies the same segment of CP rows RSTEP apart at every stage (RSTEP is even, so
    // the rows share a swizzle): its source and destination are worked out once, and a stage
    // moves them by its k alone.
    constexpr int CP = R * SEGS / (SPLIT_WARPS * 32), RSTEP = SPLIT_WARPS * 32 / SEGS;
    static_assert(CP * SPLIT_WARPS * 32 == R * SEGS && RSTEP % 2 == 0, "whole rounds of segments");
    const int xrow = threadIdx.x / SEGS, xseg = threadIdx.x % SEGS;
    const int xk = kbeg + (xseg / (SEGS / SPLIT_U)) * stride + (xseg % (SEGS / SPLIT_U)) * (16 / XB);
    const char* xsrc = xb + (size_t)xrow * in * XB;
    const size_t xstep = (size_t)RSTEP * in * XB;
    const int xdst = xrow * ROWB + (xseg ^ swz(xrow)) * 16;
    auto copy_stage = [&](int i) {
        char* st = ring + (i % NS) * STAGE + xdst;
        const int k = xk + i * SPLIT_U * stride;
        const bool kin = k < in;
#pragma unroll
        for (int n = 0; n < CP; n++) {
            const bool valid = kin && xrow + n * RSTEP < m;
            cp_async16(st + n * RSTEP * ROWB, valid ? xsrc + n * xstep + (size_t)k * XB : xb, valid);
        }
    };
    float acc[NG][4];
#pragma unroll
    for (int r = 0; r < NG; r++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[r][i] = 0.f;
    auto load = [&](uint4* va, uint4* vb, int i) {
        load_w_step<SPLIT_U>(wa, wb, kbeg + i * SPLIT_U * stride, stride, live ? in : 0, t, va, vb);
    };
    // Step i: wait for stage i (and for every warp to be done with stage i − 1, whose slot the
    // copy issued next reuses), then the MMAs of its chunks for every row group.
    auto step = [&](int i, const uint4* va, const uint4* vb) {
        cp_async_wait_group<NS - 2>();
        __syncthreads();
        if (i + NS - 1 < nsteps) copy_stage(i + NS - 1);
        cp_async_commit();
        const char* st = ring + (i % NS) * STAGE;
        // The MMAs' A quads, built once a step: passed field by field, ptxas rebuilt them (four
        // moves) before every MMA of the 8 row groups.
        uint32_t qa[SPLIT_U][2][4];
#pragma unroll
        for (int u = 0; u < SPLIT_U; u++) {
            qa[u][0][0] = va[u].x; qa[u][0][1] = vb[u].x; qa[u][0][2] = va[u].y; qa[u][0][3] = vb[u].y;
            qa[u][1][0] = va[u].z; qa[u][1][1] = vb[u].z; qa[u][1][2] = va[u].w; qa[u][1][3] = vb[u].w;
        }
#pragma unroll
        for (int u = 0; u < SPLIT_U; u++) {
#pragma unroll
            for (int r = 0; r < NG; r++) {
                const int row = 8 * r + g;
                uint32_t h[4];
                if constexpr (XH) {
                    const uint4 v = *reinterpret_cast<const uint4*>(st + row * ROWB + ((u * 4 + t) ^ swz(row)) * 16);
                    h[0] = v.x; h[1] = v.y; h[2] = v.z; h[3] = v.w;
                } else {
                    const float4 a = *reinterpret_cast<const float4*>(st + row * ROWB + ((u * 8 + 2 * t) ^ swz(row)) * 16);
                    const float4 b =
                        *reinterpret_cast<const float4*>(st + row * ROWB + ((u * 8 + 2 * t + 1) ^ swz(row)) * 16);
                    h[0] = pack_bf16(a.x, a.y); h[1] = pack_bf16(a.z, a.w);
                    h[2] = pack_bf16(b.x, b.y); h[3] = pack_bf16(b.z, b.w);
                }
                mma_bf16(acc[r], qa[u][0][0], qa[u][0][1], qa[u][0][2], qa[u][0][3], h[0], h[1]);
                mma_bf16(acc[r], qa[u][1][0], qa[u][1][1], qa[u][1][2], qa[u][1][3], h[2], h[3]);
            }
        }
    };

    pdl_trigger();
    uint4 a0[SPLIT_U], b0[SPLIT_U], a1[SPLIT_U], b1[SPLIT_U];
    if (nsteps > 0) load(a0, b0, 0);  // weights only: in flight while the previous kernel finishes
    asm volatile("prefetch.global.L2 [%0];" ::"l"(wa));  // keeps them above the wait (matvec.cu)
    pdl_wait();
#pragma unroll
    for (int i = 0; i < NS - 1; i++) {
        if (i < nsteps) copy_stage(i);
        cp_async_commit();
    }
    if constexpr (NG <= 4) {
        // Three steps of weights in flight where the accumulators leave the registers (32 rows).
        uint4 a2[SPLIT_U], b2[SPLIT_U];
        if (1 < nsteps) load(a1, b1, 1);
        for (int i = 0; i < nsteps;) {
            if (i + 2 < nsteps) load(a2, b2, i + 2);
            step(i, a0, b0);
            if (++i >= nsteps) break;
            if (i + 2 < nsteps) load(a0, b0, i + 2);
            step(i, a1, b1);
            if (++i >= nsteps) break;
            if (i + 2 < nsteps) load(a1, b1, i + 2);
            step(i, a2, b2);
            ++i;
        }
    } else {
        for (int i = 0; i < nsteps;) {
            if (i + 1 < nsteps) load(a1, b1, i + 1);
            step(i, a0, b0);
            if (++i >= nsteps) break;
            if (i + 1 < nsteps) load(a0, b0, i + 1);
            step(i, a1, b1);
            ++i;
        }
    }
    cp_async_wait_group<0>();
    __syncthreads();  // the ring is free: it holds the partial sums, then the epilogue's buffer

    // Each warp leaves its tile's partial sums in this block's shared memory, [warp][row
    // group][lane] float4: the cluster's blocks read them from there.
    float4* partials = reinterpret_cast<float4*>(ring);
#pragma unroll
    for (int r = 0; r < NG; r++) partials[(warp * NG + r) * 32 + lane] = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
    cluster_sync();

    // This block's share of the group's epilogue: TPB = 8 / ksplit tiles, those of the 8-row
    // kernel's block (grp, s) — tiles s·TPB … of the group. Each float4 of their sums is added
    // over the parts in the 8-row kernel's order, 0 + p0 + p1 + …, part q's from the cluster's
    // block grp·ks + q (its rank: blocks are numbered within a cluster of 8 as in the grid).
    const int tpb = SPLIT_WARPS / ks, outs = tpb * 16;
    float* buf = reinterpret_cast<float*>(ring + PARTIALS);  // [outs][BC]: output row, activation row
    for (int e = threadIdx.x; e < tpb * NG * 32; e += SPLIT_WARPS * 32) {
        const int tl = e / (NG * 32), r = (e / 32) % NG, ln = e % 32;
        const int src = (grp * ks) % SPLIT_CLUSTER;  // rank of part 0's block
        float4 v[SPLIT_WARPS];
#pragma unroll
        for (int q = 0; q < SPLIT_WARPS; q++)
            if (q < ks) v[q] = cluster_ld(partials + ((s * tpb + tl) * NG + r) * 32 + ln, src + q);
        float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma unroll
        for (int q = 0; q < SPLIT_WARPS; q++) {
            if (q < ks) {
                s0 += v[q].x; s1 += v[q].y; s2 += v[q].z; s3 += v[q].w;
            }
        }
        const int gl = ln >> 2, tt = ln & 3, o = tl * 16 + gl, c = 8 * r + 2 * tt;
        buf[o * BC + c] = s0;
        buf[o * BC + c + 1] = s1;
        buf[(o + 8) * BC + c] = s2;
        buf[(o + 8) * BC + c + 1] = s3;
    }
    // The pending RMSNorm of the input: row c's 1/rms from its partials, as matvec.cu's warp c.
    if (ss_in != nullptr) {
        for (int c = warp; c < m; c += SPLIT_WARPS) {
            float ss = 0.f;
            for (int j = lane; j < parts; j += 32) ss += ss_in[(size_t)c * parts + j];
            ss = warp_sum(ss);
            if (lane == 0) inv_rms[c] = rsqrtf(ss / in + eps);
        }
    }
    // Every block is done reading the others' partials (it may leave after this), and buf and
    // inv_rms are complete.
    cluster_sync();
    const int o0 = grp * SPLIT_WARPS * 16 + s * outs;
    if constexpr (!SWIGLU) {
        // Outputs in activation-row-major order (coalesced writes); each thread leaves its
        // output's square (0 where there is none) in buf for the partial sums below. In batches
        // of 4 outputs a thread whose residual and γ loads are all requested before any store.
        constexpr int BATCH = NG >= 8 ? 4 : 2;  // divides per, a multiple of 4 at 64 rows, of 2 at 32
        const int per = R * outs / (SPLIT_WARPS * 32);  // R · 16 · TPB / 256
        for (int b0 = 0; b0 < per; b0 += BATCH) {
            float yv[BATCH], gv[BATCH];
#pragma unroll
            for (int b = 0; b < BATCH; b++) {
                const int idx = threadIdx.x + (b0 + b) * SPLIT_WARPS * 32;
                const int col = idx / outs, o = o0 + idx % outs;
                const bool ok = col < m && o < out;
                yv[b] = ok && accumulate ? y[(size_t)col * out + o] : 0.f;
                gv[b] = ok && gamma != nullptr ? gamma[o] : 0.f;
            }
#pragma unroll
            for (int b = 0; b < BATCH; b++) {
                const int idx = threadIdx.x + (b0 + b) * SPLIT_WARPS * 32;
                const int col = idx / outs, tr = idx % outs, o = o0 + tr;
                float sq = 0.f;
                if (col < m && o < out) {
                    float v = buf[tr * BC + col];
                    if (ss_in != nullptr) v *= inv_rms[col];
                    const size_t i = (size_t)col * out + o;
                    v = accumulate ? yv[b] + v : v;
                    y[i] = v;
                    if (gamma != nullptr) {
                        const float xv = v * gv[b];
                        if (xg_bf16) {
                            reinterpret_cast<__nv_bfloat16*>(xgp)[i] = __float2bfloat16_rn(xv);
                        } else {
                            reinterpret_cast<float*>(xgp)[i] = xv;
                        }
                        sq = v * v;
                    }
                }
                buf[tr * BC + col] = sq;
            }
        }
        if (gamma != nullptr) {
            // This 8-row block's partial Σ y² of each row (ss_out [m, ogrid]): its tiles' rows
            // summed lane-strided, then across the warp, as matvec.cu's epilogue does; four
            // rows a warp at once, so their shuffle chains overlap.
            __syncthreads();
            constexpr int TU = 4;
            const int gob = grp * ks + s;
            for (int base = warp; base < m; base += SPLIT_WARPS * TU) {
                float ss[TU];
#pragma unroll
                for (int u = 0; u < TU; u++) {
                    const int c = base + u * SPLIT_WARPS;
                    ss[u] = 0.f;
                    if (c < m)
                        for (int j = lane; j < outs; j += 32) ss[u] += buf[j * BC + c];
                }
#pragma unroll
                for (int u = 0; u < TU; u++) ss[u] = warp_sum(ss[u]);
#pragma unroll
                for (int u = 0; u < TU; u++) {
                    const int c = base + u * SPLIT_WARPS;
                    if (lane == 0 && c < m && gob < ogrid) ss_out[(size_t)c * ogrid + gob] = ss[u];
                }
            }
        }
    } else {
        // W's rows interleave gate and up: output o/2 of row col is silu(gate) · up.
        const int pairs = outs / 2;
        for (int idx = threadIdx.x; idx < R * pairs; idx += SPLIT_WARPS * 32) {
            const int col = idx / pairs, tp = idx % pairs, o = o0 + 2 * tp;
            if (col < m && o + 1 < out) {
                float gs = buf[(2 * tp) * BC + col], us = buf[(2 * tp + 1) * BC + col];
                if (ss_in != nullptr) {
                    gs *= inv_rms[col];
                    us *= inv_rms[col];
                }
                const size_t i = (size_t)col * (out / 2) + o / 2;
                const float h = silu_split(gs) * us;
                // xg_bf16: bf16 rows for a `_x1h` consumer (down), rounded as it would round them.
                if (xg_bf16) {
                    reinterpret_cast<__nv_bfloat16*>(y)[i] = __float2bfloat16_rn(h);
                } else {
                    y[i] = h;
                }
            }
        }
    }
#endif
}

// The 64- and 32-row wide `_x1` / `_x1h` kernels of matvec.cu have their twins here, by name:
// plain (the three 8-row shapes' twins are one kernel: a part's chunk order does not depend on
// the step length) and SwiGLU. Two blocks an SM. The template takes 16 rows too; those launches
// stay on matvec.cu (untried with clusters; docs/perf.md, issue #30).
#define MATVEC_SPLIT(NAME, SW, XH, NG)                                                                          \
    extern "C" __global__ void __launch_bounds__(SPLIT_WARPS * 32, 2) SPLIT_CLUSTER_DIMS                       \
        NAME(const __nv_bfloat16* w, const void* x, float* y, int m, int in, int out, int acc, int ksplit,      \
             const float* ss_in, int parts, float eps, const float* gamma, void* xg, float* ss_out, int xg_bf16, \
             int ogrid) {                                                                                      \
        matvec_split<SW, XH, NG>(w, x, y, m, in, out, acc, ksplit, ss_in, parts, eps, gamma, xg, ss_out, xg_bf16, \
                                 ogrid);                                                                       \
    }
MATVEC_SPLIT(matvec_split_x1_w8_bf16, false, false, 8)
MATVEC_SPLIT(matvec_split_swiglu_x1_w8_bf16, true, false, 8)
MATVEC_SPLIT(matvec_split_x1h_w8_bf16, false, true, 8)
MATVEC_SPLIT(matvec_split_swiglu_x1h_w8_bf16, true, true, 8)
MATVEC_SPLIT(matvec_split_x1_w4_bf16, false, false, 4)
MATVEC_SPLIT(matvec_split_swiglu_x1_w4_bf16, true, false, 4)
MATVEC_SPLIT(matvec_split_x1h_w4_bf16, false, true, 4)
MATVEC_SPLIT(matvec_split_swiglu_x1h_w4_bf16, true, true, 4)
