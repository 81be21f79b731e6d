// Weight-stationary batched matvec: y[m, o] (+)= Σ_k x[m, k] · W[o, k], for a few rows m.
//
// The lever of small-M decoding: each weight byte is read from HBM once for all M activation
// rows, so a projection costs its weight bytes / bandwidth whether M is 1 (decode) or 8
// (verify, draft block). W is [out, in] in the checkpoint dtype, x [M, in] f32, y [M, out] f32.
// `accumulate` adds into y, which fuses the residual add into the projection that feeds it.
//
// Two kernels:
//
// * `matvec_tc_bf16` — the fast path for bf16 weights, M ≤ 8, in % 8 == 0. One block of 8 warps
//   owns a tile of 16 output rows; the warps split K (warp w takes 32-wide k chunks w, w+8, …)
//   and their partial sums are added in a fixed order through shared memory at the end, so the
//   result is deterministic and does not depend on M. Each lane issues 16-byte loads: 8
//   consecutive bf16 of one weight row, that bypass L1 and ask L2 for the row's whole
//   256-byte block; each warp keeps its next step of 2 or 4 chunks in flight (a second register
//   set) while it multiplies the current one. The multiply runs on the
//   tensor cores (`mma.sync.m16n8k16`, bf16 in, f32 accumulate) with W as the A operand and x as
//   B. Since a sum over k does not care about order, the 8 consecutive k a lane loads are fed as
//   the fragment positions {2t, 2t+1, 2t+8, 2t+9} of two MMAs — A and B use the same mapping, so
//   no shuffles are needed. x stays f32-exact: it is split into three bf16 parts
//   x = hi + mid + lo (8 + 8 + 8 mantissa bits cover f32's 24), each part an n-tile of 8
//   columns (column = activation row m), and the three partial products are added in f32. The
//   tensor cores have throughput to spare for the 3× work; what matters is that every weight
//   byte is loaded once, with wide loads, by enough warps to cover HBM latency.
//   Blocks hold 8/ksplit tiles whose K is split over ksplit warps, ksplit chosen per shape on
//   the host. A `swiglu` variant takes the gate|up matrix with rows interleaved
//   (gate_0, up_0, gate_1, …), so each tile holds whole pairs and its epilogue writes
//   silu(gate) ⊙ up: the MLP activation costs no launch and no extra pass.
//   The epilogue also carries the RMSNorm fold (crates/dspark-kernels/src/cuda/norm_fold.rs):
//   with `gamma`, the kernel that writes the residual also writes y·γ and each block's partial
//   Σ y² per row (ss_out [m, grid]); with `ss_in`, the kernel that reads such rows scales its
//   outputs by 1/rms from those partials. Neither touches the main loop.
//   An `argmax` variant (one row, M = 1) also reduces its outputs to the greedy token in the
//   same launch, as argmax_gather in argmax.cu does: each block its rows' best (value, index),
//   the last block to finish (atomic ticket after a fence) the blocks' pairs, then it copies the
//   winner's row of a table. That is one step of the draft's Markov chain — logits += W2·u, the
//   token, the next W1 row — in one launch instead of two.
//
// * `matvec_{bf16,f16,f32}` — the general kernel for any dtype and any in: one output row per
//   warp, lanes strided over k, up to 16 rows of x per launch. Prefill chunks, f16/f32
//   checkpoints and odd shapes use it.
#include "common.cuh"
#include "fp8.cuh"
#include "mma_bf16.cuh"

#define MAXM 16

template <typename T>
__device__ void matvec(const T* w, const float* x, float* y, int m, int in, int out, int accumulate) {
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= out) return;
    float acc[MAXM];
#pragma unroll
    for (int r = 0; r < MAXM; r++) acc[r] = 0.f;
    const size_t base = (size_t)warp * in;
    for (int k = lane; k < in; k += 32) {
        float wv = load_w(w, base + k);
#pragma unroll
        for (int r = 0; r < MAXM; r++)
            if (r < m) acc[r] += wv * x[(size_t)r * in + k];
    }
#pragma unroll
    for (int r = 0; r < MAXM; r++) {
        if (r < m) {
            float s = warp_sum(acc[r]);
            if (lane == 0) {
                size_t idx = (size_t)r * out + warp;
                y[idx] = accumulate ? y[idx] + s : s;
            }
        }
    }
}

extern "C" __global__ void matvec_bf16(const __nv_bfloat16* w, const float* x, float* y, int m, int in, int out, int acc) { matvec(w, x, y, m, in, out, acc); }
extern "C" __global__ void matvec_f16(const __half* w, const float* x, float* y, int m, int in, int out, int acc) { matvec(w, x, y, m, in, out, acc); }
extern "C" __global__ void matvec_f32(const float* w, const float* x, float* y, int m, int in, int out, int acc) { matvec(w, x, y, m, in, out, acc); }

// ---- tensor-core path -------------------------------------------------------------------------

#define TC_WARPS 8

// Where the argmax epilogue writes: one (value, index) pair per block, the ticket (zero before
// and after a launch), the token, and the gathered row table[token, 0..dim) as f32.
struct ArgmaxOut {
    float* v;
    uint32_t* i;
    uint32_t* ticket;
    uint32_t* out;
    const __nv_bfloat16* table;
    float* gathered;
    int dim;
};

// (best, bi) of every thread of the block, reduced to every thread; the order (common.cuh
// `better`) is total, so the shuffle butterfly and the fixed warp order give one answer.
__device__ __forceinline__ void block_best(float& best, uint32_t& bi) {
    __shared__ float wv[TC_WARPS];
    __shared__ uint32_t wi[TC_WARPS];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, best, off);
        const uint32_t i = __shfl_xor_sync(0xffffffffu, bi, off);
        if (better(v, i, best, bi)) { best = v; bi = i; }
    }
    if ((threadIdx.x & 31) == 0) { wv[threadIdx.x >> 5] = best; wi[threadIdx.x >> 5] = bi; }
    __syncthreads();
    best = wv[0];
    bi = wi[0];
#pragma unroll
    for (int w = 1; w < TC_WARPS; w++)
        if (better(wv[w], wi[w], best, bi)) { best = wv[w]; bi = wi[w]; }
    __syncthreads();  // wv / wi may be reused by the next call
}

// The argmax epilogue: this block's pair, then in the last block the token and the gather.
__device__ void argmax_tail(float best, uint32_t bi, const ArgmaxOut& a) {
    __shared__ bool last;
    block_best(best, bi);
    if (threadIdx.x == 0) {
        a.v[blockIdx.x] = best;
        a.i[blockIdx.x] = bi;
        __threadfence();
        last = atomicAdd(a.ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    best = -INFINITY;
    bi = 0xffffffffu;
    for (int s = threadIdx.x; s < (int)gridDim.x; s += blockDim.x) {
        const float v = ((volatile float*)a.v)[s];
        const uint32_t i = ((volatile uint32_t*)a.i)[s];
        if (better(v, i, best, bi)) { best = v; bi = i; }
    }
    block_best(best, bi);
    const uint32_t token = bi == 0xffffffffu ? 0u : bi;  // as argmax_split: an all-NaN row gives 0
    if (threadIdx.x == 0) {
        *a.out = token;
        *a.ticket = 0;
    }
    for (int i = threadIdx.x; i < a.dim; i += blockDim.x)
        a.gathered[i] = __bfloat162float(a.table[(size_t)token * a.dim + i]);
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// Keeps the weight loads issued above it above the PDL wait that follows. ptxas (13.0, sm_90)
// sank non-coherent loads whose results are not needed yet below `griddepcontrol.wait` in some
// kernels though the PTX has them above: the SwiGLU and tile-looping kernels requested no weights
// before their wait, the x-prefetch one 3 of its 8 (nvdisasm), which throws away what PDL is
// for. A prefetch is a memory instruction ptxas does not move across the wait, and the loads
// stay above it; its address is one the block reads anyway. The kernels whose loads stayed above
// without it do not take it, so their machine code is unchanged.
__device__ __forceinline__ void anchor_loads(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// load_w_step for FP8 bytes: chunk kc of the step at wa + (kc >> wsh) 16-byte words, wa already
// at this lane's bytes (tile order, wsh 0, or row-major, wsh 4: fp8.cuh); zeros past kend.
template <int UNROLL>
__device__ __forceinline__ void load_w_step_fp8(const uint4* wa, const uint4* wb, int chunk, int stride, int kend,
                                                int t, int wsh, uint4* va, uint4* vb) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const int kc = chunk + u * stride;
        if (kc + 16 * t < kend) {
            va[u] = ldg_stream(wa + (kc >> wsh));
            vb[u] = ldg_stream(wb + (kc >> wsh));
        } else {
            va[u] = make_uint4(0, 0, 0, 0);
            vb[u] = make_uint4(0, 0, 0, 0);
        }
    }
}

// One block = 8 warps = 8/ksplit tiles of 16 output rows, each tile's K split over ksplit warps
// (ksplit ∈ {1, 2, 4, 8}, chosen on the host: many tiles need no split, few tiles need it to keep
// enough loads in flight). A warp walks its K range in steps of UNROLL chunks, double-buffered in
// registers: step s+1's weights are requested before step s's MMAs, so a warp always has a step
// in flight instead of idling through each round trip. SWIGLU: W's rows interleave gate and up
// (row 2i = gate_i, 2i+1 = up_i) and the epilogue writes act[m, i] = silu(gate_i) · up_i to
// y [m, out/2] instead.
//
// FP8: W holds E4M3 bytes (fp8.cuh). A 16-byte load is then 16 weights, so a chunk is 64 k
// (the same bytes per chunk and per step as bf16), widened to two f16 chunks for f16 MMAs; each
// chunk's products go to fresh accumulators, added to the row's total times the chunk's block
// scale (rows g and g + 8 each their own: a tile may hold rows of two matrices, gate and up). x
// comes already scaled and split into two f16 parts (split_x_f16x2, fp8.cu), and the MMAs'
// columns are (row, part) pairs instead of rows: one MMA per 16 k covers four rows' parts, where
// bf16 takes three MMAs for any m ≤ 8 — per byte, FP8 has twice bf16's weights to widen and
// multiply, so it must issue fewer instructions per weight, and its x (two parts of 16 bits
// where bf16 loads f32) is twice the bytes per weight byte, which the L1 must serve. The parts of
// a row are summed, and its scale undone, in the epilogue. Whatever m, a row's columns and sums
// are the same: the bits do not depend on the batch. FP8 takes no XP / HOLD.
template <int UNROLL, bool SWIGLU, bool XP, bool ARGMAX, int HOLD = 0, bool FP8 = false, int NT = 2, int NG = 1,
          bool XSM = false, int XPARTS = 3, bool XH = false, bool A8 = false>
__device__ void matvec_tc(const void* __restrict__ wp, const float* __restrict__ x, float* y, int m, int in, int out,
                          int accumulate, int ksplit, const float* __restrict__ ss_in, int parts, float eps,
                          const float* __restrict__ gamma, float* xg, float* ss_out, const ArgmaxOut& am,
                          const Fp8Scales& fs, int xg_bf16 = 0) {
    static_assert(!FP8 || (!XP && HOLD == 0), "FP8 loads x inside the multiply");
    static_assert(NG == 1 || (!XP && !ARGMAX && HOLD == 0 && !XSM), "wide launches: x loaded in the multiply");
    static_assert(!XSM || (FP8 && NT == 1), "x split in the block: the one-row FP8 kernels");
    static_assert(XPARTS == 3 || (XPARTS == 1 && !FP8), "x rounded to bf16: the bf16 kernels");
    static_assert(!XH || XPARTS == 1, "x stored as bf16 rows: the `_x1h` kernels");
    static_assert(!A8 || (FP8 && NG == 1 && NT == 1), "E4M3 activations: the 8-row and one-row FP8 kernels");
    // x in three bf16 parts (f32-exact), or rounded to one (`_x1`: bf16 activations).
    auto chunk_mma = [](float (*a)[4], const uint4& va, const uint4& vb, const float* xv) {
        if constexpr (XPARTS == 1) {
            mma_chunk1(a, va, vb, xv);
        } else {
            mma_chunk3(a, va, vb, xv);
        }
    };
    constexpr int EPV = FP8 ? 16 : 8;  // weights per 16-byte load
    constexpr int CW = 4 * EPV;        // k per chunk (4 lanes of a row)
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int tiles_per_block = TC_WARPS / ksplit;
    const int tile = blockIdx.x * tiles_per_block + warp / ksplit, kpart = warp % ksplit;
    const int row0 = tile * 16;
    const int ra = min(row0 + g, out - 1), rb = min(row0 + g + 8, out - 1);  // clamped: loads stay in bounds
    const char* w = reinterpret_cast<const char*>(wp);
    constexpr size_t ESZ = FP8 ? 1 : 2;
    // FP8 in tile order (fp8.cuh): this lane's 16 bytes of row g, then of row g + 8, 512 bytes on,
    // in each 1 KB chunk of the tile; chunk kc / 64 at kc 16-byte words (wsh 0). Row-major: the
    // rows' own bytes, chunk kc at kc / 16 words past the lane's (wsh 4).
    const bool tiled = FP8 && fs.tiled;
    const int wsh = tiled ? 0 : 4;
    // A grid's tiles past `out` (its last block's) read the last tile, as row-major rows clamp to
    // out − 1 (a tiled weight's rows are whole tiles); their sums are never written.
    const uint4* wa = tiled ? reinterpret_cast<const uint4*>(w + (size_t)min(row0, out - 16) * in) + lane
                            : reinterpret_cast<const uint4*>(w + (size_t)ra * in * ESZ) + (FP8 ? t : 0);
    const uint4* wb = tiled ? wa + 32 : reinterpret_cast<const uint4*>(w + (size_t)rb * in * ESZ) + (FP8 ? t : 0);
    const bool has_x = g < m;
    // FP8: the scale rows of this lane's two weight rows (weights, not inputs: read before the wait).
    const float* sa = nullptr;
    const float* sb = nullptr;
    if constexpr (FP8) {
        sa = fs.scale + (size_t)__ldg(fs.srow + ra) * fs.cols;
        sb = fs.scale + (size_t)__ldg(fs.srow + rb) * fs.cols;
    }
    // FP8: the MMAs' n columns are (activation row, part) pairs, column c = 2·row + part, so one
    // row's two parts share an MMA: NT n-tiles, 1 for launches of m ≤ 4 rows (the `_n1` kernels),
    // else 2. Lane g's column in n-tile j is 8j + g; xcol[j] is where its part of its row starts
    // in fs.xs (−1 past 2m: zeros; 32-bit offsets, as the loop is short of registers).
    int xcol[2] = {-1, -1};
    if constexpr (A8) {
        // E4M3 activations: column g is row g, its bytes at g·in (words of 4).
        if (g < m) xcol[0] = g * (in / 4);
    } else if constexpr (FP8) {
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int c = 8 * j + g;
            if (c < 2 * m) xcol[j] = (c & 1) * fs.plane + (c >> 1) * (in / 2);
        }
    }
    // Wide FP8 launches: lane g's column in n-tile j is part xgoff[j] of its group's row
    // xgrow[j] (every group alike; a group's rows past m load zeros).
    int xgoff[2] = {0, 0}, xgrow[2] = {8, 8};
    if constexpr (FP8 && NG > 1) {
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int c = 8 * j + g;
            xgrow[j] = c >> 1;
            xgoff[j] = (c & 1) * fs.plane + (c >> 1) * (in / 2);
        }
    }
    // Where the x parts are read: fs.xs (split_x_f16x2 wrote them before this launch), or, with
    // XSM, this block's shared copy, split after the wait (split_x_block below).
    extern __shared__ uint4 xsm_raw[];
    const uint32_t* xparts = XSM ? reinterpret_cast<const uint32_t*>(xsm_raw) : fs.xs;
    // A8: the group scales of columns 2t and 2t + 1 (rows of x; past m, row m − 1's, unwritten).
    const float* sx0 = nullptr;
    const float* sx1 = nullptr;
    if constexpr (A8) {
        const float* sxb = reinterpret_cast<const float*>(xparts + fs.plane / 2);
        const int groups = in >> fs.kb_log2;
        sx0 = sxb + min(2 * t, m - 1) * groups;
        sx1 = sxb + min(2 * t + 1, m - 1) * groups;
    }
    pdl_trigger();

    // NG groups of 8 activation rows (wide launches): group r's rows are 8r .. 8r + 7, each
    // group's three part n-tiles its own accumulators, fed the same weight fragments in the same
    // order as an 8-row launch of those rows, so every row's sums are that launch's bit for bit.
    constexpr int NACC = XPARTS == 1 ? 1 : 3;  // one accumulator a part (FP8: an n-tile)
    float accg[NG][NACC][4];
#pragma unroll
    for (int r = 0; r < NG; r++)
#pragma unroll
        for (int p = 0; p < NACC; p++)
#pragma unroll
            for (int i = 0; i < 4; i++) accg[r][p][i] = 0.f;
    auto& acc = accg[0];
    // Wide launches: each group's x row for this lane (row 8r + g, or m − 1 past m; see compute_at).
    // XH: x holds bf16 rows of `in` values (a norm producer stored them rounded: xg_bf16 below).
    const char* xrow[NG];
#pragma unroll
    for (int r = 0; r < NG; r++) xrow[r] = reinterpret_cast<const char*>(x) + (size_t)min(8 * r + g, m - 1) * in * (XH ? 2 : 4);

    // Warp kpart takes chunks kpart, kpart + ksplit, … (stride ksplit·32), so the block's warps
    // together read each row's k contiguously. The loop bounds are per warp, not per lane:
    // mma.sync needs all 32 lanes, so lanes past the end of k load zeros instead of leaving.
    const int kbeg = kpart * CW, kend = in;
    const int stride = ksplit * CW;  // k between a warp's consecutive chunks
    const int step = stride * UNROLL;
    auto load = [&](uint4* va, uint4* vb, int chunk) {
        if constexpr (FP8) {
            load_w_step_fp8<UNROLL>(wa, wb, chunk, stride, kend, t, wsh, va, vb);
        } else {
            load_w_step<UNROLL, EPV>(wa, wb, chunk, stride, kend, t, va, vb);
        }
    };
    auto load_x = [&](float (*xv)[8], int chunk) {
        if constexpr (!FP8 && NG == 1) {
            if constexpr (XH) {
                load_xh_step<UNROLL>(reinterpret_cast<const uint16_t*>(x), g, chunk, stride, kend, in, has_x, t, xv);
            } else {
                load_x_step<UNROLL>(x, g, chunk, stride, kend, in, has_x, t, xv);
            }
        }
    };
    // bf16: the step's MMAs on x loaded by load_x. FP8: per chunk, x loaded here, fresh
    // accumulators, then the block-scaled sum (the chunk's k lie in one scale block).
    auto compute_at = [&](const uint4* va, const uint4* vb, float (*xv)[8], int chunk) {
        if constexpr (!FP8 && NG == 1) {
#pragma unroll
            for (int u = 0; u < UNROLL; u++) chunk_mma(acc, va[u], vb[u], xv[u]);
        } else if constexpr (!FP8) {
            // Wide: each group's x row loaded just before its MMAs (x is L1-resident; holding
            // NG groups' x a step ahead would not fit the registers). The loads are unconditional,
            // from the row pointers set up before the loop (xrow): a lane past kend reads the
            // row's last 8 values, which meet its zero weights (0 · finite = 0, the sum's bits
            // unchanged), and a group's lanes past m read row m − 1 into columns the epilogue
            // never writes (an MMA's columns are independent). Bounds checks and zero fills per
            // group and chunk had taken a third of the loop: sm_90 SASS, instructions in the main
            // loop, x1_w4 468 → 363, x1_w8 1,066 → 695 (and its spills gone), u4_x1_w4
            // 1,055 → 731, swiglu_x1_w4 532 → 376, the three-part w4 1,446 → 1,314.
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const int kx = min(chunk + u * stride + 8 * t, in - 8);
#pragma unroll
                for (int r = 0; r < NG; r++) {
                    if constexpr (XH) {
                        // x's 8 bf16 values are the MMA's operand as they lie in memory (low half =
                        // lower k, as pack_bf16 puts it): half the bytes of f32 and no conversion.
                        const uint4 h = ld_global_u4(reinterpret_cast<const uint16_t*>(xrow[r]) + kx);
                        mma_bf16(accg[r][0], va[u].x, vb[u].x, va[u].y, vb[u].y, h.x, h.y);
                        mma_bf16(accg[r][0], va[u].z, vb[u].z, va[u].w, vb[u].w, h.z, h.w);
                        continue;
                    }
                    float xr[8];
                    // A plain ld.global: x is the previous kernel's output, so never the
                    // non-coherent path (common.cuh), which unconditional reads through x's
                    // __restrict__ became; __ldca gave strong loads (LDG.STRONG.SM).
                    const float* xr4 = reinterpret_cast<const float*>(xrow[r]);
                    const float4 a = ld_global_f4(xr4 + kx), b = ld_global_f4(xr4 + kx + 4);
                    xr[0] = a.x; xr[1] = a.y; xr[2] = a.z; xr[3] = a.w;
                    xr[4] = b.x; xr[5] = b.y; xr[6] = b.z; xr[7] = b.w;
                    chunk_mma(accg[r], va[u], vb[u], xr);
                }
            }
        } else if constexpr (NG > 1) {
            // FP8, wide: each chunk's weights widened once, then every group's MMAs on them in
            // the 8-row kernel's order (per n-tile: half 0's two MMAs, then half 1's), each
            // group's chunk sums block-scaled into its own accumulators: an 8-row launch's
            // arithmetic for each group, so the same bits. Group r's rows are 8r .. 8r + 7,
            // their parts 8r·in/2 pairs further into each plane.
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const int kc = chunk + u * stride;  // warp-uniform
                if (kc >= kend) break;
                const int k = kc + 16 * t;
                const uint4 f[2][2] = {{e4m3x8_to_f16(va[u], 0), e4m3x8_to_f16(vb[u], 0)},
                                       {e4m3x8_to_f16(va[u], 1), e4m3x8_to_f16(vb[u], 1)}};
                const int kb = kc >> fs.kb_log2;
                const float s_a = sa[kb], s_b = sb[kb];
#pragma unroll
                for (int r = 0; r < NG; r++) {
                    float tmp[NT][4];
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int i = 0; i < 4; i++) tmp[j][i] = 0.f;
#pragma unroll
                    for (int h = 0; h < 2; h++) {
#pragma unroll
                        for (int j = 0; j < NT; j++) {
                            uint4 xv = make_uint4(0, 0, 0, 0);
                            if (8 * r + xgrow[j] < m && k < kend)
                                xv = *reinterpret_cast<const uint4*>(xparts + xgoff[j] + r * 4 * in + (k + 8 * h) / 2);
                            mma_f16(tmp[j], f[h][0].x, f[h][1].x, f[h][0].y, f[h][1].y, xv.x, xv.y);
                            mma_f16(tmp[j], f[h][0].z, f[h][1].z, f[h][0].w, f[h][1].w, xv.z, xv.w);
                        }
                    }
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int i = 0; i < 4; i++)
                            accg[r][j][i] = fmaf(i < 2 ? s_a : s_b, tmp[j][i], accg[r][j][i]);
                }
            }
        } else if constexpr (A8) {
            // E4M3 activations: the chunk's 64 k in two E4M3 MMAs on the bytes as loaded, fresh
            // sums scaled by the weight block's scale times the activation group's (columns 2t
            // and 2t + 1: rows of x).
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const int kc = chunk + u * stride;  // warp-uniform
                if (kc >= kend) break;
                const int k = kc + 16 * t;
                uint4 xv = make_uint4(0, 0, 0, 0);
                if (xcol[0] >= 0 && k < kend) xv = *reinterpret_cast<const uint4*>(xparts + xcol[0] + k / 4);
                float tmp[4] = {0.f, 0.f, 0.f, 0.f};
                mma_e4m3(tmp, va[u].x, vb[u].x, va[u].y, vb[u].y, xv.x, xv.y);
                mma_e4m3(tmp, va[u].z, vb[u].z, va[u].w, vb[u].w, xv.z, xv.w);
                const int kb = kc >> fs.kb_log2;
                const float s_a = sa[kb], s_b = sb[kb], x0 = sx0[kb], x1 = sx1[kb];
                acc[0][0] = fmaf(s_a * x0, tmp[0], acc[0][0]);
                acc[0][1] = fmaf(s_a * x1, tmp[1], acc[0][1]);
                acc[0][2] = fmaf(s_b * x0, tmp[2], acc[0][2]);
                acc[0][3] = fmaf(s_b * x1, tmp[3], acc[0][3]);
            }
        } else {
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const int kc = chunk + u * stride;  // warp-uniform
                if (kc >= kend) break;
                float tmp[NT][4];
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int i = 0; i < 4; i++) tmp[j][i] = 0.f;
                const int k = kc + 16 * t;
                // Column 8j + g of x's parts (plain loads: split_x_f16x2 wrote them just before).
                auto load_x16 = [&](int j, int h) {
                    uint4 v = make_uint4(0, 0, 0, 0);
                    if (xcol[j] >= 0 && k < kend) v = *reinterpret_cast<const uint4*>(xparts + xcol[j] + (k + 8 * h) / 2);
                    return v;
                };
                // Where registers allow (one n-tile, or the 2-blocks-per-SM kernels), both halves
                // of every n-tile are requested first; else each n-tile's half before its MMAs.
                constexpr bool PRE = NT == 1 || UNROLL == 4;
                uint4 xv[NT][2];
                if constexpr (PRE) {
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        xv[j][0] = load_x16(j, 0);
                        xv[j][1] = load_x16(j, 1);
                    }
                }
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const uint4 fa = e4m3x8_to_f16(va[u], h), fb = e4m3x8_to_f16(vb[u], h);
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        if constexpr (!PRE) xv[j][h] = load_x16(j, h);
                        mma_f16(tmp[j], fa.x, fb.x, fa.y, fb.y, xv[j][h].x, xv[j][h].y);
                        mma_f16(tmp[j], fa.z, fb.z, fa.w, fb.w, xv[j][h].z, xv[j][h].w);
                    }
                }
                // Plain loads: the scales are weights, but pdl_audit admits only weight streams
                // through the non-coherent path after the wait (they hit L1 across chunks).
                const int kb = kc >> fs.kb_log2;
                const float s_a = sa[kb], s_b = sb[kb];
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[j][i] = fmaf(i < 2 ? s_a : s_b, tmp[j][i], acc[j][i]);
            }
        }
    };
    // The first step's weights are in flight while the previous kernel finishes (PDL). With XP
    // (x prefetch) each step's x is loaded with the step's weights — after the wait — so its
    // latency hides behind the step before; that needs a second set of x registers and only
    // pays where the register file is not shared (measured: k/v_proj 6.97 → 6.27 µs on the
    // 1-block-per-SM kernel; decode +3% when the 2- and 3-blocks-per-SM kernels did it too).
    // A norm producer's epilogue reads γ of its rows: ask L2 for them (no register held).
    auto prefetch_gamma = [&]() {
        if (!SWIGLU && gamma != nullptr && threadIdx.x < tiles_per_block * 16 / 32 + 1) {
            const int o = min(blockIdx.x * tiles_per_block * 16 + 32 * (int)threadIdx.x, out - 1);
            asm volatile("prefetch.global.L2 [%0];" ::"l"(gamma + o));
        }
    };
    if constexpr (HOLD > 0) {
        // HOLD: the warp's whole K range (at most HOLD steps; the host checks) is requested
        // before the PDL wait and held in registers, so after the wait only x's round trip is
        // left: a few-tile launch (one layer's k or v, 16 KB a warp) is a chain of round trips
        // in the double-buffered loop. x goes a step ahead, as with XP. Same chunks, same MMAs in
        // the same order as the loop: the same sums bit for bit.
        uint4 ha[HOLD][UNROLL], hb[HOLD][UNROLL];
#pragma unroll
        for (int s = 0; s < HOLD; s++) load(ha[s], hb[s], kbeg + s * step);
        prefetch_gamma();
        anchor_loads(wa);
        pdl_wait();
        float x0[UNROLL][8], x1[UNROLL][8];
        load_x(x0, kbeg);
#pragma unroll
        for (int s = 0; s < HOLD; s += 2) {
            if (kbeg + s * step >= kend) break;
            if (s + 1 < HOLD) load_x(x1, kbeg + (s + 1) * step);
            compute_at(ha[s], hb[s], x0, kbeg + s * step);
            if (s + 1 >= HOLD || kbeg + (s + 1) * step >= kend) break;
            if (s + 2 < HOLD) load_x(x0, kbeg + (s + 2) * step);
            compute_at(ha[s + 1], hb[s + 1], x1, kbeg + (s + 1) * step);
        }
    } else {
        uint4 a0[UNROLL], b0[UNROLL], a1[UNROLL], b1[UNROLL];
        float x0[UNROLL][8], x1[UNROLL][8];
        load(a0, b0, kbeg);
        prefetch_gamma();
        if (SWIGLU || XP || FP8 || NG > 1) anchor_loads(wa);  // the others' loads stay above the wait without it (SASS)
        pdl_wait();
        // Rows of up to 12,288 (down_proj's) in one read where the kernel's registers allow
        // (UNROLL 4: launch bounds of 1–2 blocks an SM), 4,096 elsewhere (3 blocks an SM).
        if constexpr (XSM && A8) {
            quant_x_block<UNROLL == 4 ? 12 : 4>(x, in, reinterpret_cast<uint32_t*>(xsm_raw));
        } else if constexpr (XSM) {
            split_x_block<UNROLL == 4 ? 12 : 4>(x, in, reinterpret_cast<uint32_t*>(xsm_raw));
        }
        if (XP) load_x(x0, kbeg);
        for (int chunk = kbeg; chunk < kend;) {
            load(a1, b1, chunk + step);
            if (XP) {
                load_x(x1, chunk + step);
            } else {
                load_x(x0, chunk);
            }
            compute_at(a0, b0, x0, chunk);
            chunk += step;
            if (chunk >= kend) break;
            load(a0, b0, chunk + step);
            if (XP) {
                load_x(x0, chunk + step);
                compute_at(a1, b1, x1, chunk);
            } else {
                load_x(x0, chunk);
                compute_at(a1, b1, x0, chunk);
            }
            chunk += step;
        }
    }

    // C fragment: c0, c1 = (row g, cols 2t, 2t+1); c2, c3 = (row g+8, cols 2t, 2t+1); col = m
    // (bf16; the parts are acc[0..2]), or col = 8j + 2t + … of n-tile j (FP8; see xcol).
    __shared__ float part_buf[TC_WARPS * 16 * (FP8 ? 16 : 8)];
    float (*part)[16][8] = reinterpret_cast<float (*)[16][8]>(part_buf);
    __shared__ float inv_rms[8];
    // One pass of the epilogue per group of 8 rows, each exactly an 8-row launch's epilogue on
    // its rows (y, xg, ss_in and ss_out offset to them; part and inv_rms reused after a barrier).
#pragma unroll
    for (int grp = 0; grp < NG; grp++) {
        // (Group 0 takes the arguments as they are: the 8-row kernels' code is unchanged.)
        const int mg = NG == 1 ? m : min(8, m - 8 * grp);
        if (NG > 1 && mg <= 0) break;
        if (grp > 0) __syncthreads();
        float* yg = grp == 0 ? y : y + (size_t)8 * grp * (SWIGLU ? out / 2 : out);
        float* xgg = grp == 0 || xg == nullptr ? xg : xg + (size_t)8 * grp * out;
        // xg_bf16: xg holds bf16 rows instead (for an `_x1h` consumer), rounded here as the
        // consumer's `_x1` twin would round the f32 value: the same bits.
        __nv_bfloat16* xgh = reinterpret_cast<__nv_bfloat16*>(xg) + (size_t)8 * grp * out;
        const float* ssi = grp == 0 || ss_in == nullptr ? ss_in : ss_in + (size_t)8 * grp * parts;
        float* sso = grp == 0 || ss_out == nullptr ? ss_out : ss_out + (size_t)8 * grp * gridDim.x;
        if constexpr (!FP8 || A8) {
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float s;
                if constexpr (A8 || XPARTS == 1) {
                    s = accg[grp][0][i];
                } else {
                    s = (accg[grp][2][i] + accg[grp][1][i]) + accg[grp][0][i];
                }
                int r = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
                part[warp][r][col] = s;
            }
        } else {
            // Each row's two part columns summed lo + hi and scaled back by 2^-s (exact),
            // through shared memory: the columns sit in different lanes.
            float (*raw)[16][16] = reinterpret_cast<float (*)[16][16]>(part_buf);
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) raw[warp][g + (i >= 2 ? 8 : 0)][8 * j + 2 * t + (i & 1)] = j < NT ? accg[grp][j][i] : 0.f;
            __syncthreads();
            const float* xscale = reinterpret_cast<const float*>(xparts + 2 * (size_t)fs.plane) + 8 * grp;
            float v[4];
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int r = (lane + 32 * q) >> 3, col = (lane + 32 * q) & 7;
                v[q] = col < mg ? (raw[warp][r][2 * col + 1] + raw[warp][r][2 * col]) * xscale[col] : 0.f;
            }
            __syncthreads();
#pragma unroll
            for (int q = 0; q < 4; q++) part[warp][(lane + 32 * q) >> 3][(lane + 32 * q) & 7] = v[q];
        }
        // Pending RMSNorm of the input (see the header): warp c reduces row c's partial sums of
        // squares in a fixed order, so every consumer of those rows computes the same 1/rms.
        if (ssi != nullptr && warp < mg) {
            float ss = 0.f;
            for (int j = lane; j < parts; j += 32) ss += ssi[(size_t)warp * parts + j];
            ss = warp_sum(ss);
            if (lane == 0) inv_rms[warp] = rsqrtf(ss / in + eps);
        }
        __syncthreads();
        // Partial sums of a tile's warps are added in a fixed order: deterministic, M-independent.
        if (!SWIGLU) {
            float sqv[TC_WARPS * 128 / (TC_WARPS * 32)];  // the squares of this thread's (≤ 4) outputs
            float best = -INFINITY;  // ARGMAX: this thread's best output of row 0 and its index
            uint32_t bi = 0xffffffffu;
#pragma unroll
            for (int k = 0; k < TC_WARPS * 128 / (TC_WARPS * 32); k++) {
                const int idx = threadIdx.x + k * TC_WARPS * 32;
                if (idx >= tiles_per_block * 128) break;
                int tl = idx >> 7, r = (idx >> 3) & 15, col = idx & 7;
                int o = (blockIdx.x * tiles_per_block + tl) * 16 + r;
                float sq = 0.f;
                if (col < mg && o < out) {
                    float s = 0.f;
                    for (int kp = 0; kp < ksplit; kp++) s += part[tl * ksplit + kp][r][col];
                    if (ssi != nullptr) s *= inv_rms[col];
                    size_t i = (size_t)col * out + o;
                    s = accumulate ? yg[i] + s : s;
                    yg[i] = s;
                    if (ARGMAX && col == 0 && better(s, (uint32_t)o, best, bi)) {
                        best = s;
                        bi = (uint32_t)o;
                    }
                    if (gamma != nullptr) {
                        const float v = s * gamma[o];
                        if (xg_bf16) {
                            xgh[i] = __float2bfloat16_rn(v);
                        } else {
                            xgg[i] = v;
                        }
                        sq = s * s;
                    }
                }
                sqv[k] = sq;
            }
            if (gamma != nullptr) {
                // Producer of a norm: this block's partial Σ y² of each row, over its tiles' rows in
                // a fixed order. The squares go through `part` (free once every thread has read its
                // sums): tile row j's square of row `col` sits at flat index j·8 + col.
                float* sqs = &part[0][0][0];
                __syncthreads();
#pragma unroll
                for (int k = 0; k < TC_WARPS * 128 / (TC_WARPS * 32); k++) {
                    const int idx = threadIdx.x + k * TC_WARPS * 32;
                    if (idx < tiles_per_block * 128) sqs[idx] = sqv[k];
                }
                __syncthreads();
                if (warp < mg) {
                    float ss = 0.f;
                    for (int j = lane; j < tiles_per_block * 16; j += 32) ss += sqs[j * 8 + warp];
                    ss = warp_sum(ss);
                    if (lane == 0) sso[(size_t)warp * gridDim.x + blockIdx.x] = ss;
                }
            }
            if constexpr (ARGMAX) argmax_tail(best, bi, am);
        } else {
            for (int idx = threadIdx.x; idx < tiles_per_block * 64; idx += blockDim.x) {
                int tl = idx >> 6, p = (idx >> 3) & 7, col = idx & 7;
                int o = (blockIdx.x * tiles_per_block + tl) * 16 + 2 * p;
                if (col < mg && o + 1 < out) {
                    float gs = 0.f, us = 0.f;
                    for (int kp = 0; kp < ksplit; kp++) {
                        gs += part[tl * ksplit + kp][2 * p][col];
                        us += part[tl * ksplit + kp][2 * p + 1][col];
                    }
                    if (ssi != nullptr) {
                        gs *= inv_rms[col];
                        us *= inv_rms[col];
                    }
                    const float h = silu(gs) * us;
                    // xg_bf16: act as bf16 rows for an `_x1h` consumer (down), rounded as an
                    // `_x1` consumer rounds x (indexed from y: yg's offset counts f32 values).
                    if (xg_bf16) {
                        reinterpret_cast<__nv_bfloat16*>(y)[(size_t)(8 * grp + col) * (out / 2) + o / 2] =
                            __float2bfloat16_rn(h);
                    } else {
                        yg[(size_t)col * (out / 2) + o / 2] = h;
                    }
                }
            }
        }
    }
}

// The tile-looping twin, for many short tiles: Markov W2 (151936 × 256) is 9496 tiles of 16
// rows whose K is 8 chunks, 4 steps of a warp. matvec_tc runs them as 1187 blocks in three
// rounds of resident blocks, each block paying its first load's round trip and its epilogue's
// barriers for 4 steps of loads (71% of the ceiling, where lm_head's 4096-long tiles on the same
// grid reach 98%). Here one wave of blocks (2 per SM, the host's grid) walks the tiles: warp w of
// W takes tiles w, w + W, …, and its register double buffer runs on from one tile's last step
// into the next tile's first, so a warp's loads stay in flight from its first step to its last.
// Steps of 4 chunks (a W2 tile in two) at 2 blocks per SM keep 128 KB of weights in flight per
// SM, against 96 KB for steps of 2 at 3 blocks (80 registers): W2 21.66–21.74 → 21.36–21.47 µs
// a call replayed from a graph (measured; git history of docs/perf.md).
// K is not split, so a warp's accumulators hold its tile's whole sums and it writes the outputs
// from its MMA fragments itself (no shared memory, no barrier), the same values as matvec_tc at
// ksplit 1 bit for bit. The argmax variant keeps each thread's best output over all its tiles and
// reduces once at the end (argmax_tail). No RMSNorm fold (the host passes none).
template <bool ARGMAX>
__device__ void matvec_tc_loop(const __nv_bfloat16* __restrict__ w, const float* __restrict__ x, float* y, int m,
                               int in, int out, int accumulate, const ArgmaxOut& am) {
    constexpr int UNROLL = 4, STEP = 32 * UNROLL;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int tiles = (out + 15) / 16, nw = gridDim.x * TC_WARPS;
    const bool has_x = g < m;
    pdl_trigger();
    // Cursors: the tile and first k of the next step to load (lt, lk) and to compute (ct, ck).
    int lt = blockIdx.x * TC_WARPS + warp, lk = 0;
    int ct = lt, ck = 0;
    auto load = [&](uint4* va, uint4* vb) {
        const int row0 = lt * 16;
        const int ra = min(row0 + g, out - 1), rb = min(row0 + g + 8, out - 1);  // clamped: in bounds
        const uint4* wa = reinterpret_cast<const uint4*>(w + (size_t)ra * in);
        const uint4* wb = reinterpret_cast<const uint4*>(w + (size_t)rb * in);
        load_w_step<UNROLL>(wa, wb, lk, 32, lt < tiles ? in : 0, t, va, vb);  // past the last tile: zeros
        lk += STEP;
        if (lk >= in) {
            lk = 0;
            lt += nw;
        }
    };
    float acc[3][4];
#pragma unroll
    for (int p = 0; p < 3; p++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[p][i] = 0.f;
    float best = -INFINITY;  // ARGMAX: this thread's best output of row 0 and its index
    uint32_t bi = 0xffffffffu;
    // One step's multiply (x loaded for it first), then, after a tile's last step, its outputs.
    auto step = [&](const uint4* va, const uint4* vb) {
        float xv[UNROLL][8];
        load_x_step<UNROLL>(x, g, ck, 32, in, in, has_x, t, xv);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) mma_chunk3(acc, va[u], vb[u], xv[u]);
        ck += STEP;
        if (ck < in) return;
        // C fragment: c0, c1 = (row g, cols 2t, 2t+1); c2, c3 = (row g+8, …); col = m. The sum is
        // matvec_tc's at ksplit 1 (there: 0 + the one warp's part), rounding for rounding.
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int col = 2 * t + (i & 1), o = ct * 16 + g + (i >= 2 ? 8 : 0);
            float s = 0.f;
            s += (acc[2][i] + acc[1][i]) + acc[0][i];
            if (col < m && o < out) {
                const size_t idx = (size_t)col * out + o;
                s = accumulate ? y[idx] + s : s;
                y[idx] = s;
                if (ARGMAX && col == 0 && better(s, (uint32_t)o, best, bi)) {
                    best = s;
                    bi = (uint32_t)o;
                }
            }
#pragma unroll
            for (int p = 0; p < 3; p++) acc[p][i] = 0.f;
        }
        ck = 0;
        ct += nw;
    };
    uint4 a0[UNROLL], b0[UNROLL], a1[UNROLL], b1[UNROLL];
    load(a0, b0);  // weights only: in flight while the previous kernel finishes (PDL)
    anchor_loads(w + (size_t)min(blockIdx.x * TC_WARPS * 16, out - 1) * in);
    pdl_wait();
    while (ct < tiles) {
        load(a1, b1);
        step(a0, b0);
        if (ct >= tiles) break;
        load(a0, b0);
        step(a1, b1);
    }
    if constexpr (ARGMAX) argmax_tail(best, bi, am);
}

// Three shapes of the same kernel, chosen on the host so the grid fits one wave (cuda/matvec.rs
// `tc_kernel`), all measured with `dspark bench --matvec-variants` (docs/perf.md):
// * many tiles, or more blocks than 2 per SM (gate|up, lm_head, Markov W2, q|k|v's 384 tiles):
//   2 chunks per step at 3 blocks per SM;
// * K split over all 8 warps in at most 2 blocks per SM (o, down, fc): 4 chunks per step;
// * no more blocks than SMs (one layer's k|v alone): 4 chunks per step with the register file to
//   itself, x prefetched a step ahead; where a warp's K range is at most 4 steps (K ≤ 4096 at
//   split 8) all of it is requested before the PDL wait and held (`_u4b1h`, 240 registers):
//   1024 × 4096 at M = 7 took 5.0–5.1 µs a call against 5.4 replayed from a graph.
// The argmax variant (one row, the draft's Markov step) is the first shape with the argmax
// epilogue. Every variant takes the argmax epilogue's arguments (null and unused in the others).
// NG > 1: the wide twins below (NG groups of 8 rows a launch).
// xg_bf16 (last): a norm producer writes xg, a SwiGLU kernel act, as bf16 rows for an `_x1h`
// consumer.
#define MATVEC_TC_HNPX(NAME, U, SW, XP, AM, MINB, HOLD, NG, XPARTS, XH)                                         \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32, MINB)                                           \
        NAME(const __nv_bfloat16* w, const float* x, float* y, int m, int in, int out, int acc, int ksplit,      \
             const float* ss_in, int parts, float eps, const float* gamma, float* xg, float* ss_out, float* am_v, \
             uint32_t* am_i, uint32_t* am_ticket, uint32_t* am_out, const __nv_bfloat16* am_table,                \
             float* am_gathered, int am_dim, int xg_bf16) {                                                       \
        const ArgmaxOut am{am_v, am_i, am_ticket, am_out, am_table, am_gathered, am_dim};                         \
        matvec_tc<U, SW, XP, AM, HOLD, false, 2, NG, false, XPARTS, XH>(                                          \
            w, x, y, m, in, out, acc, ksplit, ss_in, parts, eps, gamma, xg, ss_out, am, Fp8Scales{}, xg_bf16);    \
    }
#define MATVEC_TC_HNP(NAME, U, SW, XP, AM, MINB, HOLD, NG, XPARTS) \
    MATVEC_TC_HNPX(NAME, U, SW, XP, AM, MINB, HOLD, NG, XPARTS, false)
#define MATVEC_TC_HN(NAME, U, SW, XP, AM, MINB, HOLD, NG) MATVEC_TC_HNP(NAME, U, SW, XP, AM, MINB, HOLD, NG, 3)
#define MATVEC_TC_H(NAME, U, SW, XP, AM, MINB, HOLD) MATVEC_TC_HN(NAME, U, SW, XP, AM, MINB, HOLD, 1)
#define MATVEC_TC(NAME, U, SW, XP, AM, MINB) MATVEC_TC_H(NAME, U, SW, XP, AM, MINB, 0)
MATVEC_TC(matvec_tc_bf16, 2, false, false, false, 3)
MATVEC_TC(matvec_tc_u4_bf16, 4, false, false, false, 2)
MATVEC_TC(matvec_tc_u4b1_bf16, 4, false, true, false, 1)
// The same with the warp's whole K range held in registers (at most 4 steps of 4 chunks).
MATVEC_TC_H(matvec_tc_u4b1h_bf16, 4, false, true, false, 1, 4)
// W rows interleave gate and up; y is act [m, out/2] = silu(gate) ⊙ up.
MATVEC_TC(matvec_tc_swiglu_bf16, 2, true, false, false, 3)
// One row; its outputs also reduced to the greedy token, whose row of a table is gathered.
MATVEC_TC(matvec_tc_argmax_bf16, 2, false, false, true, 3)

// Wide launches (issue #30's batched steps): the same three shapes and the SwiGLU epilogue for
// 16 or 32 activation rows a launch (NG groups of 8), x loaded per group inside the multiply.
// A row's bits are those of the 8-row kernels (same K split, chunks and MMA order per group).
// The set of wide twins, for a kernel macro W(NAME, U, SW, MINB, NG) and a dtype suffix (the
// FP8 one below takes it too).
#define MATVEC_TC_WIDE_SET(W, SFX)                    \
    W(matvec_tc_w2_##SFX, 2, false, 2, 2)             \
    W(matvec_tc_w4_##SFX, 2, false, 2, 4)             \
    W(matvec_tc_u4_w2_##SFX, 4, false, 1, 2)          \
    W(matvec_tc_u4_w4_##SFX, 4, false, 1, 4)          \
    W(matvec_tc_swiglu_w2_##SFX, 2, true, 2, 2)       \
    W(matvec_tc_swiglu_w4_##SFX, 2, true, 2, 4)
#define MATVEC_TC_W(NAME, U, SW, MINB, NG) MATVEC_TC_HN(NAME, U, SW, false, false, MINB, 0, NG)
MATVEC_TC_WIDE_SET(MATVEC_TC_W, bf16)

// The `_x1` twins of the plain, wide and SwiGLU kernels above (`--activations bf16`): x rounded
// to bf16, one MMA part (mma_chunk1), otherwise the same K split, chunks and epilogue, so a row's
// bits still do not depend on the launch's rows (nor on wide or 8-row launches).
#define MATVEC_TC_X1(NAME, U, SW, XP, MINB, HOLD, NG) MATVEC_TC_HNP(NAME, U, SW, XP, false, MINB, HOLD, NG, 1)
MATVEC_TC_X1(matvec_tc_x1_bf16, 2, false, false, 3, 0, 1)
MATVEC_TC_X1(matvec_tc_u4_x1_bf16, 4, false, false, 2, 0, 1)
MATVEC_TC_X1(matvec_tc_u4b1_x1_bf16, 4, false, true, 1, 0, 1)
MATVEC_TC_X1(matvec_tc_u4b1h_x1_bf16, 4, false, true, 1, 4, 1)
MATVEC_TC_X1(matvec_tc_swiglu_x1_bf16, 2, true, false, 3, 0, 1)
MATVEC_TC_X1(matvec_tc_x1_w2_bf16, 2, false, false, 2, 0, 2)
MATVEC_TC_X1(matvec_tc_x1_w4_bf16, 2, false, false, 2, 0, 4)
MATVEC_TC_X1(matvec_tc_u4_x1_w2_bf16, 4, false, false, 1, 0, 2)
MATVEC_TC_X1(matvec_tc_u4_x1_w4_bf16, 4, false, false, 1, 0, 4)
MATVEC_TC_X1(matvec_tc_swiglu_x1_w2_bf16, 2, true, false, 2, 0, 2)
MATVEC_TC_X1(matvec_tc_swiglu_x1_w4_bf16, 2, true, false, 2, 0, 4)
// 64 rows a launch: one part leaves the registers for eight groups' accumulators.
MATVEC_TC_X1(matvec_tc_x1_w8_bf16, 2, false, false, 2, 0, 8)
MATVEC_TC_X1(matvec_tc_u4_x1_w8_bf16, 4, false, false, 1, 0, 8)
MATVEC_TC_X1(matvec_tc_swiglu_x1_w8_bf16, 2, true, false, 2, 0, 8)

// The `_x1h` twins of the `_x1` kernels: x read as the bf16 rows a norm producer stored
// (xg_bf16), half the bytes of f32 x, each value the one the `_x1` twin rounds to: the same sums
// bit for bit. What x's bytes cost the wide launches: docs/perf.md, issue #30.
#define MATVEC_TC_X1H(NAME, U, SW, XP, MINB, HOLD, NG) MATVEC_TC_HNPX(NAME, U, SW, XP, false, MINB, HOLD, NG, 1, true)
MATVEC_TC_X1H(matvec_tc_x1h_bf16, 2, false, false, 3, 0, 1)
MATVEC_TC_X1H(matvec_tc_u4_x1h_bf16, 4, false, false, 2, 0, 1)
MATVEC_TC_X1H(matvec_tc_u4b1_x1h_bf16, 4, false, true, 1, 0, 1)
MATVEC_TC_X1H(matvec_tc_u4b1h_x1h_bf16, 4, false, true, 1, 4, 1)
MATVEC_TC_X1H(matvec_tc_swiglu_x1h_bf16, 2, true, false, 3, 0, 1)
MATVEC_TC_X1H(matvec_tc_x1h_w2_bf16, 2, false, false, 2, 0, 2)
MATVEC_TC_X1H(matvec_tc_x1h_w4_bf16, 2, false, false, 2, 0, 4)
MATVEC_TC_X1H(matvec_tc_u4_x1h_w2_bf16, 4, false, false, 1, 0, 2)
MATVEC_TC_X1H(matvec_tc_u4_x1h_w4_bf16, 4, false, false, 1, 0, 4)
MATVEC_TC_X1H(matvec_tc_swiglu_x1h_w2_bf16, 2, true, false, 2, 0, 2)
MATVEC_TC_X1H(matvec_tc_swiglu_x1h_w4_bf16, 2, true, false, 2, 0, 4)
MATVEC_TC_X1H(matvec_tc_x1h_w8_bf16, 2, false, false, 2, 0, 8)
MATVEC_TC_X1H(matvec_tc_u4_x1h_w8_bf16, 4, false, false, 1, 0, 8)
MATVEC_TC_X1H(matvec_tc_swiglu_x1h_w8_bf16, 2, true, false, 2, 0, 8)

// The FP8 twins of the shapes a Qwen3 target's projections take (q|k|v, o, down, gate|up; the
// k|v-alone shape without the hold): W is E4M3 bytes, and four more arguments carry its block
// scales (fp8.cuh `Fp8Scales`), and whether its bytes are in tile order. The argmax epilogue's
// arguments stay for one launch signature.
#define MATVEC_TC_FP8XWA(NAME, U, SW, MINB, NT, XSM, NG, A8)                                                     \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32, MINB)                                           \
        NAME(const uint8_t* w, const float* x, float* y, int m, int in, int out, int acc, int ksplit,            \
             const float* ss_in, int parts, float eps, const float* gamma, float* xg, float* ss_out, float* am_v, \
             uint32_t* am_i, uint32_t* am_ticket, uint32_t* am_out, const __nv_bfloat16* am_table,                \
             float* am_gathered, int am_dim, const float* scale, const uint32_t* srow, int scale_cols,          \
             int kb_log2, const uint32_t* xs, int plane, int tiled) {                                             \
        const ArgmaxOut am{am_v, am_i, am_ticket, am_out, am_table, am_gathered, am_dim};                         \
        matvec_tc<U, SW, false, false, 0, true, NT, NG, XSM, 3, false, A8>(                                       \
            w, x, y, m, in, out, acc, ksplit, ss_in, parts, eps, gamma, xg, ss_out, am,                                 \
            Fp8Scales{scale, srow, scale_cols, kb_log2, xs, plane, tiled});                                             \
    }
#define MATVEC_TC_FP8XW(NAME, U, SW, MINB, NT, XSM, NG) MATVEC_TC_FP8XWA(NAME, U, SW, MINB, NT, XSM, NG, false)
#define MATVEC_TC_FP8X(NAME, U, SW, MINB, NT, XSM) MATVEC_TC_FP8XW(NAME, U, SW, MINB, NT, XSM, 1)
#define MATVEC_TC_FP8(NAME, U, SW, MINB, NT) MATVEC_TC_FP8X(NAME, U, SW, MINB, NT, false)
MATVEC_TC_FP8(matvec_tc_fp8, 2, false, 3, 2)
MATVEC_TC_FP8(matvec_tc_u4_fp8, 4, false, 2, 2)
MATVEC_TC_FP8(matvec_tc_u4b1_fp8, 4, false, 1, 2)
MATVEC_TC_FP8(matvec_tc_swiglu_fp8, 2, true, 3, 2)
// The same for launches of at most four rows (decode): one n-tile of (row, part) columns.
MATVEC_TC_FP8(matvec_tc_n1_fp8, 2, false, 3, 1)
MATVEC_TC_FP8(matvec_tc_u4_n1_fp8, 4, false, 2, 1)
MATVEC_TC_FP8(matvec_tc_u4b1_n1_fp8, 4, false, 1, 1)
MATVEC_TC_FP8(matvec_tc_swiglu_n1_fp8, 2, true, 3, 1)
// The same for one row with x split inside the launch (`_n1x`: split_x_block into dynamic shared
// memory, 4·in + 16 bytes; no split_x_f16x2 launch before it). The same parts, scale and MMAs:
// the same bits as the two launches.
MATVEC_TC_FP8X(matvec_tc_n1x_fp8, 2, false, 3, 1, true)
MATVEC_TC_FP8X(matvec_tc_u4_n1x_fp8, 4, false, 2, 1, true)
MATVEC_TC_FP8X(matvec_tc_u4b1_n1x_fp8, 4, false, 1, 1, true)
MATVEC_TC_FP8X(matvec_tc_swiglu_n1x_fp8, 2, true, 3, 1, true)
// Wide launches (batched rounds of an FP8 target): 16 or 32 rows a launch, NG groups of 8 on one
// read of the weights, each group's columns, MMAs and epilogue an 8-row launch's: the same bits.
// x split for all the launch's rows by one split_x_f16x2 before it, as for eight.
#define MATVEC_TC_FP8W(NAME, U, SW, MINB, NG) MATVEC_TC_FP8XW(NAME, U, SW, MINB, 2, false, NG)
MATVEC_TC_WIDE_SET(MATVEC_TC_FP8W, fp8)
// E4M3 activations (fp8.cuh; experiment `DSPARK_FP8_A8=1`): one n-tile of rows for any m ≤ 8,
// x quantized by quant_x_e4m3 before the launch, or in the block for one row (`_a8x`).
#define MATVEC_TC_A8(NAME, U, SW, MINB, XSM) MATVEC_TC_FP8XWA(NAME, U, SW, MINB, 1, XSM, 1, true)
MATVEC_TC_A8(matvec_tc_a8_fp8, 2, false, 3, false)
MATVEC_TC_A8(matvec_tc_u4_a8_fp8, 4, false, 2, false)
MATVEC_TC_A8(matvec_tc_u4b1_a8_fp8, 4, false, 1, false)
MATVEC_TC_A8(matvec_tc_swiglu_a8_fp8, 2, true, 3, false)
MATVEC_TC_A8(matvec_tc_a8x_fp8, 2, false, 3, true)
MATVEC_TC_A8(matvec_tc_u4_a8x_fp8, 4, false, 2, true)
MATVEC_TC_A8(matvec_tc_u4b1_a8x_fp8, 4, false, 1, true)
MATVEC_TC_A8(matvec_tc_swiglu_a8x_fp8, 2, true, 3, true)

// The tile-looping twins (matvec_tc_loop): same arguments, K never split (ksplit, the norm
// fold's and, without ARGMAX, the argmax epilogue's arguments unused).
#define MATVEC_TC_LOOP(NAME, AM)                                                                                  \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32, 2)                                                \
        NAME(const __nv_bfloat16* w, const float* x, float* y, int m, int in, int out, int acc, int ksplit,      \
             const float* ss_in, int parts, float eps, const float* gamma, float* xg, float* ss_out, float* am_v, \
             uint32_t* am_i, uint32_t* am_ticket, uint32_t* am_out, const __nv_bfloat16* am_table,                \
             float* am_gathered, int am_dim, int /* xg_bf16: one launch signature */) {                           \
        const ArgmaxOut am{am_v, am_i, am_ticket, am_out, am_table, am_gathered, am_dim};                         \
        matvec_tc_loop<AM>(w, x, y, m, in, out, acc, am);                                                         \
    }
MATVEC_TC_LOOP(matvec_tc_loop_bf16, false)
MATVEC_TC_LOOP(matvec_tc_loop_argmax_bf16, true)

// Interleaved gate|up rows → act = silu(gate) ⊙ up for the general path: gu [rows, 2·inter]
// with column 2i = gate_i, 2i+1 = up_i; act [rows, inter].
extern "C" __global__ void swiglu_pairs_f32(const float* gu, float* act, int inter, int rows) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * inter) return;
    size_t r = idx / inter, i = idx % inter;
    act[idx] = silu(gu[r * 2 * inter + 2 * i]) * gu[r * 2 * inter + 2 * i + 1];
}
